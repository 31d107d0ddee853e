"""grad-accumulation/discarded-backward: backward passes whose gradients a `zero_grad()` cleared
before any optimizer step used them (`probe.clears`), found by their cause with or without a
baseline: accumulation written around a `zero_grad()` that still runs at every micro-batch
trains on one micro-batch of every k, at the cost of all k.

One finding per clearing line, at that line. High when the line discarded at least
`MIN_BLOCKING` backward passes and at least `MIN_SHARE` of all the run's backward calls (the
accumulation mistake discards k-1 of every k); a discard now and then (the last micro-batches
of an epoch cleared at the next one's start, a step skipped by hand on a bad batch) is medium.
"""

from __future__ import annotations

from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness import located
from traingate.stages.correctness.probe.payloads import DiscardSite, GradientsPayload

CATEGORY = Category.GRAD_ACCUMULATION
RULE = f"{CATEGORY.value}/discarded-backward"
MIN_BLOCKING = 2
MIN_SHARE = 0.25


def discarded_findings(ctx: StageContext, gradients: GradientsPayload | None, fallback: Location) -> list[Finding]:
    if gradients is None or not gradients.discarded:
        return []
    return [_finding(ctx, gradients, record, fallback) for record in gradients.discarded if record.backwards > 0]


def _finding(ctx: StageContext, gradients: GradientsPayload, record: DiscardSite, fallback: Location) -> Finding:
    total = max(gradients.backward_calls, record.backwards)
    share = record.backwards / total if total else 1.0
    blocking = record.backwards >= MIN_BLOCKING and share >= MIN_SHARE
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
