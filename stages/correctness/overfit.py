"""no-learning, opt-in: trained on one repeated batch, the loss must fall by the policy's
`overfit_min_reduction` (the "overfit one batch" sanity check of every training recipe).

The loss of an optimizer step is the sum of the losses backward ran on before it (one per
micro-batch with accumulation); the first step's is compared with the mean of the last
three steps'.
"""

from __future__ import annotations

import math
from collections import defaultdict

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import LossesPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import NO_LEARNING
from traingate.stages.correctness.config import CorrectnessPolicy

CATEGORY = NO_LEARNING
TAIL = 3


def step_losses(losses: LossesPayload | None) -> list[float]:
    """The loss of each optimizer step: the backward losses made before it, summed (none
    without the payload: the run handed back none)."""
    if losses is None:
        return []
    per_step: defaultdict[int, float] = defaultdict(float)
    for value, step in zip(losses.losses, losses.steps_of_calls, strict=False):
        if isinstance(value, (int, float)):
            per_step[step] += float(value)
        else:
            per_step[step] = math.nan
    return [per_step[s] for s in sorted(per_step)]


def reduction(curve: list[float]) -> float | None:
    """1 - (mean of the last steps' loss) / (first step's loss); None when undefined (fewer
    than TAIL + 1 steps, or a first loss that is not positive)."""
    if len(curve) <= TAIL or not curve[0] > 0:
        return None
    tail = curve[-TAIL:]
    return 1.0 - (sum(tail) / len(tail)) / curve[0]


def overfit_finding(ctx: StageContext, curve: list[float], fraction: float, losses: LossesPayload, steps: int, fallback: Location) -> list[Finding]:
    required = ctx.thresholds(CorrectnessPolicy).overfit_min_reduction
    if fraction >= required:
        return []
    sites = losses.backward_sites
    site = sites[0] if sites else None
    shown = ", ".join(f"{v:.4g}" for v in curve[:3]) + " ... " + ", ".join(f"{v:.4g}" for v in curve[-TAIL:])
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.HIGH,
            title=f"Trained {steps} steps on one repeated batch, the loss fell by only {fraction:.0%} (policy: at least {required:.0%})",
            location=located.location(losses, site, fallback),
            problem=(
                f"The entrypoint was run with every DataLoader handing out its first batch again and again, for {steps} optimizer steps. "
                f"A model that can learn memorises one batch; here the loss went from {curve[0]:.6g} to {sum(curve[-TAIL:]) / TAIL:.6g} "
                f"(mean of the last {TAIL} steps), a reduction of {fraction:.1%}, below the policy's {required:.0%}. Losses: {shown}."
            ),
            impact="A model that cannot fit a single batch cannot fit the data set: the loss, the targets' shape, the output activation or the update is wrong.",
            fix="Check that the loss compares outputs and targets of the same shape (no silent broadcasting), that the output activation matches the loss, and that the learning rate is sensible.",
            evidence=Evidence(
                kind=EvidenceKind.MEASURED,
                summary=f"loss {curve[0]:.6g} -> {sum(curve[-TAIL:]) / TAIL:.6g} over {steps} steps on one batch ({fraction:.1%} reduction, required {required:.0%})",
                data={"step_losses": curve[:500], "reduction": fraction, "required": required, "steps": steps, "backward_site": site_record(located.site(losses, site))},
            ),
            key="overfit",
        )
    ]
