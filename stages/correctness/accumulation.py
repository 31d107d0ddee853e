"""grad-accumulation: k accumulated micro-batches of b must give the gradient of one batch of k*b.

The gradient the first `step()` applies is compared, not the update: an adaptive optimizer
(Adam) normalises the first update, so a loss k times too large would leave it unchanged
while every later update (and any gradient clipping) is off.
"""

from __future__ import annotations

import math
from typing import TypedDict

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import FirstUpdatePayload, LossesPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import GRAD_ACCUMULATION
from traingate.stages.correctness.config import CorrectnessPolicy

CATEGORY = GRAD_ACCUMULATION


class Setup(TypedDict):
    """The configured kwargs and the sizes the two runs are given."""

    accumulation_kwarg: str
    batch_size_kwarg: str
    accumulation: int  # k
    batch_size: int  # b


class Comparison(TypedDict):
    relative_difference: float
    gradient_norm_ratio: float
    update_norm_ratio: float | None
    parameters: int


def compare_first_updates(accumulated: FirstUpdatePayload, large: FirstUpdatePayload) -> Comparison | None:
    """The relative difference of the sampled gradients and the ratio of the full gradient
    norms (accumulated over large batch); None when the two runs' parameters do not line up or
    a gradient is not finite (NaN and inf reach here as None: JSON has no spelling for them)."""
    a_params, b_params = accumulated.params, large.params
    if not a_params or len(a_params) != len(b_params):
        return None
    diff2 = ref2 = a_norm2 = b_norm2 = 0.0
    update_ratio_num = update_ratio_den = 0.0
    for a, b in zip(a_params, b_params, strict=True):
        if a.numel != b.numel or (a.grad_sample is None) != (b.grad_sample is None):
            return None
        if a.grad_sample is None or b.grad_sample is None:
            continue
        a_sample, b_sample = _finite_values(a.grad_sample), _finite_values(b.grad_sample)
        if a.grad_norm is None or b.grad_norm is None or a_sample is None or b_sample is None or not _finite([a.grad_norm, b.grad_norm]):
            return None
        diff2 += sum((x - y) ** 2 for x, y in zip(a_sample, b_sample, strict=True))
        ref2 += sum(y * y for y in b_sample)
        a_norm2 += a.grad_norm ** 2
        b_norm2 += b.grad_norm ** 2
        update_ratio_num += _finite_or_zero(a.update_norm) ** 2
        update_ratio_den += _finite_or_zero(b.update_norm) ** 2
    if ref2 == 0.0 or b_norm2 == 0.0:
        return None
    return {
        "relative_difference": math.sqrt(diff2 / ref2),
        "gradient_norm_ratio": math.sqrt(a_norm2 / b_norm2),
        "update_norm_ratio": math.sqrt(update_ratio_num / update_ratio_den) if update_ratio_den else None,
        "parameters": len(a_params),
    }


def _finite(values: list[float | None]) -> bool:
    return all(isinstance(v, (int, float)) and math.isfinite(v) for v in values)


def _finite_values(values: list[float | None]) -> list[float] | None:
    """The values when every one is finite, else None."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    return finite if len(finite) == len(values) else None


def _finite_or_zero(value: float | None) -> float:
    return float(value) if value is not None and math.isfinite(value) else 0.0


def accumulation_finding(
    ctx: StageContext, comparison: Comparison, losses: LossesPayload | None, setup: Setup, fallback: Location
) -> list[Finding]:
    tolerance = ctx.thresholds(CorrectnessPolicy).grad_accumulation_tolerance
    difference = comparison["relative_difference"]
    if difference <= tolerance:
        return []
    k, ratio = setup["accumulation"], comparison["gradient_norm_ratio"]
    backward_sites = losses.backward_sites if losses is not None else []
    site = backward_sites[0] if backward_sites else None
    scale = f" The accumulated gradient is {ratio:.3g}x the large batch's" + (f" (about k = {k}: the loss is not divided by the accumulation steps)." if abs(ratio - k) / k < 0.1 else ".")
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.HIGH,
            title=f"Accumulating {k} micro-batches gives a gradient {difference:.0%} off one batch of {k * setup['batch_size']} (tolerance {tolerance:.0%})",
            location=located.location(losses, site, fallback),
            problem=(
                f"One update with {setup['accumulation_kwarg']}={k} and {setup['batch_size_kwarg']}={setup['batch_size']} was compared with one with "
                f"{setup['accumulation_kwarg']}=1 and {setup['batch_size_kwarg']}={k * setup['batch_size']}, same data and seeds: the gradients "
                f"the first step applied differ by {difference:.2%} (relative), above the policy's {tolerance:.2%}." + scale
            ),
            evidence=Evidence(
                kind=EvidenceKind.MEASURED,
                summary=f"relative gradient difference {difference:.4f}, norm ratio {ratio:.4f}, tolerance {tolerance}",
                data={**comparison, **setup, "tolerance": tolerance, "backward_site": site_record(located.site(losses, site)), "backward_calls": losses.calls if losses is not None else None},
            ),
            key="grad-accumulation",
        )
    ]
