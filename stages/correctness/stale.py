"""stale-gradients: optimizer steps that applied gradient carried over from before their
previous step, because nothing cleared `.grad` in between (`probe.gradients`).

Where the function that steps (or calls backward) holds a `zero_grad()` that never ran, the
finding is located at that call and names the branch that skipped it (`skipped_clears`):
the fix is to take the clear out from under its condition, not to add another."""

from __future__ import annotations

from traingate.stages.correctness.details import NotApplicable, StaleCheck
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import GradientsPayload, StaleStep
from traingate.stages.correctness import located
from traingate.stages.correctness.skipped_clears import SkippedClear, skipped_clears
from traingate.stages.correctness.rules import STALE_GRADIENTS

CATEGORY = STALE_GRADIENTS
PER_STEP = {"step", "carried_norm", "applied_norm", "carried_share", "params_carrying", "params"}  # of a stale step, in the evidence
NOT_APPLICABLE = "not applicable: no optimizer step followed a backward call made after that optimizer's previous step (fewer than two steps to compare)"


def stale_gradient_check(ctx: StageContext, gradients: GradientsPayload | None, fallback: Location) -> tuple[list[Finding], StaleCheck | NotApplicable]:
    """The findings, one per line that steps, and the check's record for the stage report
    (not applicable without the payload: the run handed back none)."""
    if gradients is None or not gradients.judged:
        return [], NotApplicable(ran=False, applicable=False, note=NOT_APPLICABLE)
    judged = gradients.judged
    record = StaleCheck(ran=True, applicable=True, steps_judged=judged, steps_stale=gradients.stale_count, largest_carried_share=gradients.largest_share)
    by_site: dict[int | None, list[StaleStep]] = {}
    for step in gradients.stale:
        by_site.setdefault(step.site, []).append(step)
    # Steps past the listed ones are counted, not kept: all theirs when one line steps.
    counts = {site: (gradients.stale_count if len(by_site) == 1 else len(steps)) for site, steps in by_site.items()}
    findings = [_finding(ctx, gradients, steps, counts[site], fallback) for site, steps in by_site.items()]
    return findings, record


def _ratio(step: StaleStep) -> str:
    share = step.carried_share
    return "an unknown share" if share is None else f"{share:.2f}x the norm"


def _skipped(ctx: StageContext, gradients: GradientsPayload, step: StaleStep) -> list[SkippedClear]:
    """The `zero_grad()` calls of the stepping and backward functions that ran at fewer steps
    than there were, the likeliest cause first."""
    where = [(s.path, s.line) for s in (located.site(gradients, step.site), located.site(gradients, step.backward_site)) if s is not None]
    calls: dict[tuple[str, int], int] = {}
    for clear in gradients.clear_sites:
        if (s := located.site(gradients, clear.site)) is not None:
            calls[(s.path, s.line)] = calls.get((s.path, s.line), 0) + clear.calls
    # A clear serves one optimizer: with several stepping in turn, each takes its share of the steps.
    optimizers = 1 + max((s.optimizer for s in gradients.stale), default=0)
    return skipped_clears(ctx.root, where, calls, max(1, gradients.steps // optimizers))


def _finding(ctx: StageContext, gradients: GradientsPayload, steps: list[StaleStep], count: int, fallback: Location) -> Finding:
    first = steps[0]
    judged = gradients.judged
    backward = located.site(gradients, first.backward_site)
    backward_text = f"{backward.path}:{backward.line} (`{backward.code}`)" if backward else "a line outside the target"
    step_code = located.code(gradients, first.site) or "optimizer.step()"
    listed = ", ".join(str(s.step) for s in steps[:10]) + (", ..." if count > 10 else "")
    shares = [s.carried_share for s in steps if s.carried_share is not None]
    skipped = _skipped(ctx, gradients, first)
    cause = skipped[0] if skipped else None
    return ctx.finding(
        category=CATEGORY,
        title=(
            f"{count} of {judged} optimizer step(s) applied gradients carried over from before the previous step: "
            + (_cause_title(cause) if cause else "`.grad` is never cleared between steps")
        ),
        location=Location(path=cause.path, line=cause.line, function=cause.function) if cause else located.location(gradients, first.site, fallback),
        problem=(
            (_cause_problem(cause, gradients.steps) if cause else "")
            + f"Between optimizer step {first.step} and the previous step of its optimizer nothing cleared the gradients of {first.params_carrying} of "
            f"{first.params} parameter(s) (no `zero_grad()`, `set_to_none` or `param.grad = None`), so the backward call at {backward_text} added to what was already there "
            f"and `{step_code}` applied the sum. At step {first.step} the gradient carried over had {_ratio(first)} of the gradient the step applied"
            + (f" (up to {max(shares):.2f}x over the steps affected)" if shares else "")
            + f". Steps affected: {listed}."
        ),
        fix=(
            f"Take `{cause.code}` out from under `{cause.branch_code}`: clear the gradients at every step, whatever the condition (right after `{step_code}`)."
            if cause and cause.branch_line is not None else None
        ),
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"{count} of {judged} step(s) carried earlier gradients; carried/applied gradient norm at step {first.step}: {_ratio(first)}",
            data={
                "steps_affected": [s.step for s in steps],
                "steps_stale": count,
                "steps_judged": judged,
                "step_site": site_record(located.site(gradients, first.site)),
                "backward_site": located.record(backward) if backward else None,
                "skipped_clears": [c.data() for c in skipped],
                "per_step": [s.model_dump(mode="json", include=PER_STEP) for s in steps[:50]],
            },
        ),
        key="stale-gradients",
    )


def _cause_title(cause: SkippedClear) -> str:
    return f"`{cause.code}` at line {cause.line} never ran" if not cause.calls else f"`{cause.code}` at line {cause.line} ran at {cause.calls} of {cause.steps} step(s)"


def _cause_problem(cause: SkippedClear, steps: int) -> str:
    if not cause.calls:
        return f"The clearing call `{cause.code}` at {cause.path}:{cause.line} exists but did not run once in {steps} optimizer step(s): it sits {cause.describe()}. "
    return f"The clearing call `{cause.code}` at {cause.path}:{cause.line} did not run between every two steps: it sits {cause.describe()}. "
