"""`perf-regression`: step time or peak memory worse than the baseline beyond measurement noise.

Compared only metrics of the same id from the baseline report's performance stage, and
only when the baseline was measured on the same kind of device (a CPU step time says nothing
about a GPU's). A step time regresses when it is slower by more than max(10 %, 3 x the
relative spread (IQR / median) of either run); a peak memory when it is larger by more than
10 % (memory measurements repeat to the byte or the allocator block). 50 % or worse is high.
Each step-time ratio is shown with the interval both runs' IQRs allow, "within noise" when
it covers 1.
"""

from __future__ import annotations

from traingate.stages.performance.details import RegressionDetails, RegressionRow, SpreadRecord
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Metric, PipelineReport, Severity
from traingate.stages.base import StageContext
from traingate.stages.performance.sign_test import sign_test
from traingate.stages.performance.spread import ratio_from_iqr

CATEGORY = Category.PERF_REGRESSION
# Metric ids of peak-memory measurements start with this.
PEAK_MEMORY_PREFIX = "memory.peak."
MIN_RELATIVE = 0.10
SPREAD_FACTOR = 3.0
HIGH_RATIO = 1.5


def _baseline_metrics(baseline: PipelineReport) -> dict[str, Metric]:
    for stage in baseline.stages:
        if stage.name == "performance":
            return {m.id: m for m in stage.metrics if m.id}
    return {}


def compare(ctx: StageContext, metrics: list[Metric], spreads: dict[str, str], device: str) -> tuple[RegressionDetails, list[Finding]]:
    """`spreads` maps the id of a step-time metric to the id of its IQR metric; peak-memory
    metrics are those whose id starts with PEAK_MEMORY_PREFIX."""
    baseline = ctx.baseline
    if not baseline:
        return RegressionDetails(compared=[], note="no baseline given"), []
    base_device = baseline.environment.device
    if base_device and base_device != device:
        return RegressionDetails(compared=[], note=f"baseline measured on {base_device}, this run on {device}: not comparable"), []
    old = _baseline_metrics(baseline)
    current = {m.id: m for m in metrics}
    compared, findings = [], []
    for metric_id, metric in current.items():
        before = old.get(metric_id)
        if before is None or not isinstance(before.value, (int, float)) or not isinstance(metric.value, (int, float)) or before.value <= 0:
            continue
        ratio = float(metric.value) / float(before.value)
        if metric_id in spreads:
            spread_now = _relative(current.get(spreads[metric_id]), metric)
            spread_then = _relative(old.get(spreads[metric_id]), before)
            allowed = max(MIN_RELATIVE, SPREAD_FACTOR * max(spread_now, spread_then))
            kind = "step time"
        elif metric_id.startswith(PEAK_MEMORY_PREFIX):
            spread_now = spread_then = 0.0
            allowed = MIN_RELATIVE
            kind = "peak memory"
        else:
            continue
        regressed = ratio - 1 > allowed
        row = RegressionRow(
            metric=metric.name, metric_id=metric_id, unit=metric.unit, baseline=before.value, current=metric.value, ratio=round(ratio, 4), allowed=round(allowed, 4),
            regressed=regressed, spread=_ratio_spread(metric_id, spreads, current, old, float(metric.value), float(before.value)),
        )
        compared.append(row)
        if regressed:
            findings.append(_finding(ctx, kind, row, spread_now, spread_then, device, baseline.version))
    return RegressionDetails(compared=compared, note=None if compared else "the baseline has no performance metrics of the same ids"), findings


def few_steps(ctx: StageContext, label: str, times_s: list[float], device: str) -> tuple[RegressionRow | None, Finding | None]:
    """Fewer profiled steps than a median needs: each step against the baseline's median step
    time plus the allowed 10 %, by a one-sided sign test. Every one of 5 steps slower is a
    regression at p = 0.031; anything less decides nothing. The step time stays unreported
    as a metric (no median on so few steps)."""
    baseline = ctx.baseline
    if not baseline or not times_s:
        return None, None
    if baseline.environment.device and baseline.environment.device != device:
        return None, None
    metric_id = f"step_time.median.{label}"
    before = _baseline_metrics(baseline).get(metric_id)
    if before is None or not isinstance(before.value, (int, float)) or before.value <= 0:
        return None, None
    limit_ms = float(before.value) * (1 + MIN_RELATIVE)
    steps_ms = [t * 1e3 for t in times_s]
    test = sign_test(steps_ms, limit_ms)
    current = sorted(steps_ms)[len(steps_ms) // 2]
    row = RegressionRow(
        metric=f"step time, median ({label})", metric_id=metric_id, unit="ms", baseline=before.value,
        current=round(current, 4), ratio=round(current / float(before.value), 4), allowed=MIN_RELATIVE,
        regressed=test.decisive_above, spread=None, steps=len(steps_ms),
        sign_test=test.record(f"slower than the baseline median + {MIN_RELATIVE:.0%}"),
    )
    if not test.decisive_above:
        return row, None
    return row, _finding(ctx, "step time", row, 0.0, 0.0, device, baseline.version)


def _ratio_spread(metric_id: str, spreads: dict[str, str], current: dict[str, Metric], old: dict[str, Metric], now: float, then: float) -> SpreadRecord | None:
    """The step-time ratio's interval from both runs' IQRs (the baseline keeps no per-step
    times); None for metrics without a spread."""
    if metric_id not in spreads:
        return None
    iqr_now, iqr_then = _value(current.get(spreads[metric_id])), _value(old.get(spreads[metric_id]))
    if iqr_now is None or iqr_then is None:
        return None
    spread = ratio_from_iqr(now, iqr_now, then, iqr_then)
    return spread.record(digits=4) if spread else None


def _value(metric: Metric | None) -> float | None:
    value = metric.value if metric is not None else None
    return float(value) if isinstance(value, (int, float)) else None


def _relative(spread: Metric | None, centre: Metric) -> float:
    value, middle = _value(spread), _value(centre)
    if value is None or middle is None or middle <= 0:
        return 0.0
    return value / middle


def _finding(ctx: StageContext, kind: str, row: RegressionRow, spread_now: float, spread_then: float, device: str, version: str | None) -> Finding:
    worse = row.ratio - 1
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH if row.ratio >= HIGH_RATIO else Severity.MEDIUM,
        title=f"{kind.capitalize()} regressed {worse:.0%} against the baseline ({row.metric})",
        location=None,
        problem=(
            f"{row.metric} is {row.current:,} {row.unit} against {row.baseline:,} {row.unit} in the baseline"
            f"{f' (version {version})' if version else ''}: {worse:.1%} worse, beyond the {row.allowed:.0%} allowed for measurement noise."
        ),
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"{row.current:,} vs {row.baseline:,} {row.unit} ({row.ratio:.2f}x) on {device}",
            data={**row.data(), "relative_spread_now": round(spread_now, 4), "relative_spread_baseline": round(spread_then, 4), "device": device},
        ),
        key=row.metric_id,
    )
