"""grad-accumulation/discarded-backward: backward passes whose gradients a `zero_grad()` cleared
before any optimizer step used them (`probe.clears`), found by their cause with or without a
baseline: accumulation written around a `zero_grad()` that still runs at every micro-batch
trains on one micro-batch of every k, at the cost of all k.

One finding per clearing line, at that line. High when the line discarded backward passes at
`MIN_BLOCKING` clears at least and at as many clears as `MIN_STEP_SHARE` of the optimizer steps
(the accumulation mistake discards at every micro-batch but the last, so at every step); a
discard now and then (a step skipped by hand on a non-finite gradient, the last micro-batches
of an epoch cleared at the next one's start) is medium; a single one is not reported.
"""

from __future__ import annotations

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness import located
from traingate.stages.correctness.probe.payloads import DiscardSite, GradientsPayload
from traingate.stages.correctness.rules import GRAD_ACCUMULATION

CATEGORY = GRAD_ACCUMULATION
RULE = f"{CATEGORY.value}/discarded-backward"
MIN_REPORTED = 2
MIN_BLOCKING = 2
MIN_STEP_SHARE = 0.5


def discarded_findings(ctx: StageContext, gradients: GradientsPayload | None, fallback: Location) -> list[Finding]:
    if gradients is None or not gradients.discarded:
        return []
    # One clear in the whole run is a step given up on once, on purpose or not: not a pattern.
    return [_finding(ctx, gradients, record, fallback) for record in gradients.discarded if record.backwards > 0 and record.clears >= MIN_REPORTED]


def _finding(ctx: StageContext, gradients: GradientsPayload, record: DiscardSite, fallback: Location) -> Finding:
    total = max(gradients.backward_calls, record.backwards)
    share = record.backwards / total if total else 1.0
    blocking = record.clears >= MIN_BLOCKING and record.clears >= MIN_STEP_SHARE * gradients.steps
    site = located.site(gradients, record.site)
    code = site.code if site else record.call + "()"
    where = f"{site.path}:{site.line}" if site else "a line outside the target"
    return ctx.finding(
        category=CATEGORY,
        rule=RULE,
        severity=Severity.HIGH if blocking else Severity.MEDIUM,
        title=f"{record.backwards} of {total} backward pass(es) computed gradients that `{code}` cleared before any optimizer step used them",
        location=located.location(gradients, record.site, fallback),
        problem=(
            f"`{code}` at {where} ran {record.clears} time(s) after backward calls whose gradients no optimizer step had applied yet, and cleared them: "
            f"{record.backwards} of the run's {total} backward pass(es) ({share:.0%}) were computed and thrown away. The step that followed each clear "
            "applied only the gradients of the backward calls made after it. In an accumulation loop this is a `zero_grad()` that still runs at every "
            "micro-batch: each step trains on one micro-batch and the others cost their forward and backward for nothing."
        ),
        fix=(
            f"Move `{code}` next to the optimizer step (right after `optimizer.step()`, under the same accumulation condition), so that it clears "
            "only gradients a step has applied."
        ),
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"{record.backwards} of {total} backward pass(es) discarded by {record.clears} clear(s) at {where}",
            data={
                "discarded_backwards": record.backwards,
                "backward_calls": total,
                "discarded_share": round(share, 4),
                "clears_discarding": record.clears,
                "clear_call": record.call,
                "clear_site": site_record(site),
                "steps": gradients.steps,
            },
        ),
        key=f"discarded-backward:{where}",
    )
