"""gradient-clipping: a clip whose gradients are not the ones the next optimizer step applies
(`probe.clipping`, handed back with the steps)."""

from __future__ import annotations

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import ClipRecord, StepsPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import GRADIENT_CLIPPING

CATEGORY = GRADIENT_CLIPPING


def clipping_findings(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    return [_finding(ctx, steps, clip, fallback) for clip in steps.clips]


def _line(steps: StepsPayload, index: int | None) -> str:
    found = located.site(steps, index)
    return f"{found.path}:{found.line} (`{found.code}`)" if found else "a line outside the target"


def _finding(ctx: StageContext, steps: StepsPayload, clip: ClipRecord, fallback: Location) -> Finding:
    backward = _line(steps, clip.backward_site)
    listed = ", ".join(str(s) for s in clip.step_indexes[:10]) + (", ..." if clip.steps > 10 else "")
    if clip.kind == "before-backward":
        what = (
            f"ran before the backward at {backward} of the step it was meant for: it clipped gradients that were cleared or left from before, "
            "and the gradients the backward then made reached the optimizer step unclipped"
        )
        short = "before the backward"
    else:
        what = f"clipped the gradients, and the backward at {backward} then added to them before the optimizer step: what the step applies was never clipped"
        short = "before a later backward"
    return ctx.finding(
        category=CATEGORY,
        title=f"`{clip.function}` ran {short}: {clip.steps} of {steps.steps} optimizer step(s) applied unclipped gradients",
        location=located.location(steps, clip.site, fallback),
        problem=f"`{clip.function}` at {_line(steps, clip.site)} {what}. Steps affected: {listed} (the first: step {clip.first_step}).",
        fix=f"Move the `{clip.function}` call after the backward at {backward}, right before `optimizer.step()` (with a GradScaler, after `scaler.unscale_(optimizer)`).",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{clip.steps} optimizer step(s) after a backward that ran after the clip",
            data={
                "function": clip.function,
                "kind": clip.kind,
                "clip_site": site_record(located.site(steps, clip.site)),
                "backward_site": site_record(located.site(steps, clip.backward_site)),
                "steps_affected": clip.step_indexes,
                "steps": clip.steps,
                "steps_observed": steps.steps,
            },
        ),
        key=f"{clip.function}:{clip.kind}",
    )
