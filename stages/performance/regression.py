"""`perf-regression`: step time or peak memory worse than the baseline beyond measurement noise.

A step time is judged, where the baseline's commit is in the clone, from the baseline's code
timed beside this version's in this run (stages/performance/side_by_side.py): `side_by_side`
turns that verdict into a finding. Without the baseline's code, a step time is compared with
the number stored in the baseline report only where both were measured on the same machine
(CPU model and cores, device, torch build, stages/performance/load.py, and the OpenMP wait
policy the runs had, stages/contract/target_env.py), both runs' timing runs
had the machine to themselves (quiet), and neither timing's spread (IQR / median) exceeds
MAX_SPREAD; anything else is listed as not comparable, with the reason: never a finding, never
passed. A compared step time regresses when slower by more than max(10 %, 3 x the relative
spread of either run). A peak memory, which load does not move, is compared on the same kind
of device and regresses when larger by more than 10 % (it repeats to the byte or the allocator
block). 50 % or worse is high. Each step-time ratio is shown with the interval both runs' IQRs
allow, "within noise" when it covers 1.
"""

from __future__ import annotations

from pydantic import ValidationError

from traingate.stages.performance.details import MachineRecord, NotComparable, PerformanceDetails, RegressionDetails, RegressionRow, SideBySide, SpreadRecord
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Metric, PipelineReport, Severity
from traingate.stages.base import StageContext
from traingate.stages.performance.sign_test import sign_test
from traingate.stages.performance.spread import ratio_from_iqr
from traingate.stages.performance.rules import PERF_REGRESSION

CATEGORY = PERF_REGRESSION
# Metric ids of peak-memory measurements start with this.
PEAK_MEMORY_PREFIX = "memory.peak."
MIN_RELATIVE = 0.10
SPREAD_FACTOR = 3.0
HIGH_RATIO = 1.5
# A stored step time whose runs spread more than this (IQR / median) is noise, not a measure: a
# margin of 3 x the spread would pass a slowdown of half again.
MAX_SPREAD = 0.15
STEP_TIME_PREFIX = "step_time.median."


class Timings:
    """Where this run's timings were taken: what a stored timing is compared by."""

    def __init__(self, machine: MachineRecord | None, quiet: bool, load_note: str, side_by_side: set[str] | None = None) -> None:
        self.machine = machine
        self.quiet = quiet  # every timing run had the machine to itself
        self.load_note = load_note  # what the other processes took, in words
        self.side_by_side = side_by_side or set()  # timing labels judged against the baseline's code


def _baseline_metrics(baseline: PipelineReport) -> dict[str, Metric]:
    for stage in baseline.stages:
        if stage.name == "performance":
            return {m.id: m for m in stage.metrics if m.id}
    return {}


def compare(ctx: StageContext, metrics: list[Metric], spreads: dict[str, str], device: str, timings: Timings | None = None) -> tuple[RegressionDetails, list[Finding]]:
    """`spreads` maps the id of a step-time metric to the id of its IQR metric; peak-memory
    metrics are those whose id starts with PEAK_MEMORY_PREFIX. `timings`: where this run's
    timings were taken (None: nowhere known, so no stored step time compares)."""
    baseline = ctx.baseline
    if not baseline:
        return RegressionDetails(compared=[], note="no baseline given"), []
    base_device = baseline.environment.device
    if base_device and base_device != device:
        return RegressionDetails(compared=[], note=f"baseline measured on {base_device}, this run on {device}: not comparable"), []
    old = _baseline_metrics(baseline)
    current = {m.id: m for m in metrics}
    compared, findings, not_comparable = [], [], []
    for metric_id, metric in current.items():
        before = old.get(metric_id)
        if before is None or not isinstance(before.value, (int, float)) or not isinstance(metric.value, (int, float)) or before.value <= 0:
            continue
        ratio = float(metric.value) / float(before.value)
        if metric_id in spreads:
            spread_now = _relative(current.get(spreads[metric_id]), metric)
            spread_then = _relative(old.get(spreads[metric_id]), before)
            if metric_id.removeprefix(STEP_TIME_PREFIX) in (timings.side_by_side if timings else set()):
                continue  # judged against the baseline's code, timed beside this version's
            reason = stored_timing_reason(baseline, timings, (spread_now, spread_then))
            if reason:
                not_comparable.append(NotComparable(metric=metric.name, metric_id=metric_id, reason=reason))
                continue
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
    note = None if compared or not_comparable else "the baseline has no performance metrics of the same ids"
    return RegressionDetails(compared=compared, note=note, not_comparable=not_comparable), findings


def stored_timing_reason(baseline: PipelineReport, timings: Timings | None, spreads: tuple[float, float] | None) -> str | None:
    """Why a step time stored in `baseline` cannot be compared with this run's (None: it can):
    another machine, a busy one on either side, or a spread beyond MAX_SPREAD."""
    if timings is None or timings.machine is None:
        return "this run did not record the machine its timings ran on"
    then = _baseline_details(baseline)
    if then is None or then.machine is None:
        return "the baseline report records no machine for its timings (an older gate), so its step times may come from any machine under any load"
    differs = _machine_differences(then.machine, timings.machine)
    if differs:
        return f"measured on another machine ({differs})"
    if not timings.quiet:
        return f"this run's timing runs shared the machine ({timings.load_note})"
    loads = [r.load for r in then.runs if r.load is not None]
    if not loads or not all(load.quiet for load in loads):
        share = max((load.other_cpu_share or 0.0 for load in loads), default=None)
        return "the baseline's timing runs shared the machine" + (f" (other processes took {share:.0%} of its CPU time)" if share else "")
    noisy = [f"{label} {value:.0%}" for label, value in zip(("this run", "the baseline"), spreads or (0.0, 0.0), strict=True) if value > MAX_SPREAD]
    if noisy:
        return f"the step times spread more (IQR / median: {', '.join(noisy)}) than the {MAX_SPREAD:.0%} under which a stored number is a measure"
    return None


def _baseline_details(baseline: PipelineReport) -> PerformanceDetails | None:
    for stage in baseline.stages:
        if stage.name == "performance" and stage.details:
            try:
                return PerformanceDetails.model_validate(stage.details)
            except ValidationError:
                return None
    return None


def _machine_differences(then: MachineRecord, now: MachineRecord) -> str:
    """What differs between two machines, in words ("" where nothing does); a CPU model or a
    torch build neither side knows counts as a difference."""
    fields = (
        ("CPU", then.cpu_model, now.cpu_model), ("cores", then.cpus, now.cpus), ("device", then.device, now.device), ("device name", then.device_name, now.device_name),
        ("torch", then.torch, now.torch), ("OpenMP wait policy", then.omp_wait_policy, now.omp_wait_policy),
    )
    found = []
    for name, a, b in fields:
        if a != b:
            found.append(f"{name} {a} then, {b} now")
        elif a is None and name in ("CPU", "torch"):
            found.append(f"{name} unknown")
    return "; ".join(found)


def side_by_side_row(result: SideBySide) -> RegressionRow | None:
    """The side-by-side verdict as a compared row; None where it was not measured."""
    if result.verdict == "not measured" or result.current_step_ms is None or result.baseline_step_ms is None or result.baseline_step_ms <= 0:
        return None
    return RegressionRow(
        metric=f"step time, lower quartile ({result.label}), timed beside the baseline's code", metric_id=f"{STEP_TIME_PREFIX}{result.label}", unit="ms",
        baseline=result.baseline_step_ms, current=result.current_step_ms, ratio=round(result.current_step_ms / result.baseline_step_ms, 4),
        allowed=result.threshold, regressed=result.verdict == "slower", spread=None,
    )


def side_by_side(ctx: StageContext, result: SideBySide, device: str) -> Finding | None:
    """The finding for a side-by-side verdict of "slower"; None otherwise. Its ratio is the
    smallest of the pairs that were slower (the least the runs beside each other show)."""
    row = side_by_side_row(result)
    if row is None or not row.regressed:
        return None
    least = max((min(p.spread.ratio for p in m.pairs) for m in result.measures if m.verdict == "slower" and m.pairs), default=row.ratio)
    row = row.model_copy(update={"ratio": round(least, 4)})
    finding = _finding(ctx, "step time", row, 0.0, 0.0, device, ctx.baseline.version if ctx.baseline else None)
    problem = (
        f"The baseline's code (commit {result.commit[:12]}) and this version's were timed alternately in this run on this machine "
        f"({', '.join(result.order)}): this version's step takes {result.current_step_ms:,} ms against the baseline's {result.baseline_step_ms:,} ms (each run's lower quartile, the median over the runs). {result.reason}."
    )
    data = {**finding.evidence.data, "side_by_side": result.data()}
    for key in ("relative_spread_now", "relative_spread_baseline"):
        data.pop(key, None)
    return finding.model_copy(update={"problem": problem, "evidence": finding.evidence.model_copy(update={"data": data})})


def few_steps(ctx: StageContext, label: str, times_s: list[float], device: str, timings: Timings | None = None) -> tuple[RegressionRow | NotComparable | None, Finding | None]:
    """Fewer profiled steps than a median needs: each step against the baseline's median step
    time plus the allowed 10 %, by a one-sided sign test. Every one of 5 steps slower is a
    regression at p = 0.031; anything less decides nothing. The step time stays unreported
    as a metric (no median on so few steps). Compared only where a stored step time compares
    (`stored_timing_reason`), else not comparable."""
    baseline = ctx.baseline
    if not baseline or not times_s:
        return None, None
    if baseline.environment.device and baseline.environment.device != device:
        return None, None
    if timings is not None and label in timings.side_by_side:
        return None, None
    metric_id = f"step_time.median.{label}"
    before = _baseline_metrics(baseline).get(metric_id)
    if before is None or not isinstance(before.value, (int, float)) or before.value <= 0:
        return None, None
    reason = stored_timing_reason(baseline, timings, None)
    if reason:
        return NotComparable(metric=f"step time, median ({label})", metric_id=metric_id, reason=reason), None
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
