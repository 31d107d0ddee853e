"""The performance checks: one object per check, each naming the runs it decides from
(`stages/agent/checks.py`): the instrumented run's payload (`FULL`) and the timing runs' step clocks
(`LIGHT`). The stage lists them in `CHECKS` (`stage.py`), in the order they run; each adds its
findings, its metrics and what it could not measure, and the regression check reads the step
times the step-time check measured before it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from traingate.pipeline.model.schema import Finding, Location, Metric
from traingate.stages.base import StageContext, location_of
from traingate.stages.agent.checks import Checked
from traingate.stages.agent.observed_test import observed_test_note
from traingate.stages.performance import amp as perf_amp, memory as perf_memory, regression as perf_regression, sync as perf_sync, timing as perf_timing
from traingate.stages.performance.details import AmpDetails, NotComparable, RegressionDetails, RegressionRow, SideBySide, StepRecord
from traingate.stages.performance.leak import HOST_MIN_SLOPE_BYTES, MIN_SLOPE_BYTES
from traingate.stages.performance.config import PerformancePolicy
from traingate.stages.performance.probe.payloads import PERFORMANCE_FULL as FULL, PERFORMANCE_LIGHT as LIGHT, FullPayload, SiteKey, StepClockRecord


@dataclass(frozen=True)
class TimingEnvironment:
    """Where the timing runs ran and what the baseline's code measured beside them."""

    timings: perf_regression.Timings
    side_by_side: SideBySide | None = None
    side_note: str | None = None  # why the baseline's code was not timed beside this version's


@dataclass
class PerformanceFacts:
    """What the checks read (the instrumented run's payload, the fastest timing run of each
    setting, where they ran) and what they add up: metrics, what was not measured, and the
    step times the regression check compares."""

    ctx: StageContext
    device: str
    warmup: int
    min_steps: int
    profile: FullPayload
    timings: dict[str, StepClockRecord]
    flag: str | None  # the entrypoint's AMP switch; None: AMP is not compared
    environment: TimingEnvironment | None = None
    findings: list[Finding] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    not_comparable: list[NotComparable] = field(default_factory=list)  # stored step times with too few steps for a median
    spreads: dict[str, str] = field(default_factory=dict)  # median metric id -> its IQR metric id
    few_step_rows: list[RegressionRow] = field(default_factory=list)  # sign tests against the baseline

    @property
    def conditions(self) -> perf_regression.Timings | None:
        """Where the timing runs ran (None: not recorded, so no stored step time compares)."""
        return self.environment.timings if self.environment else None

    @property
    def primary(self) -> str:
        return "amp" if self.flag else "default"

    @property
    def primary_clock(self) -> StepClockRecord | None:
        """The primary timing run's step clock (AMP on where there is a switch)."""
        return self.timings.get(self.primary) or next(iter(self.timings.values()), None)


class MemoryLeak:
    """memory-leak: one verdict over tensor bytes, held graphs and host memory, a metric each."""

    name = "memory"
    reads = (FULL,)

    def evaluate(self, out: PerformanceFacts) -> Checked:
        profile = out.profile
        memory, leaks = perf_memory.analyse(out.ctx, profile.memory, out.warmup, out.min_steps, out.device, _loop_site(profile.clock))
        verdict = memory.verdict
        # One verdict over the measures: a leak found from any one fails this metric, whatever the others say.
        decided = verdict.leak or verdict.steps >= out.min_steps
        out.metrics.append(Metric(
            id="memory.held_growth",
            name="memory held between steps, growth",
            value=round(verdict.slope_bytes_per_step, 1),
            unit="bytes/step",
            threshold=MIN_SLOPE_BYTES,
            passed=not verdict.leak if decided else None,
            note=f"{'leak' if verdict.leak else 'no leak'}: {verdict.reason}; bytes r^2 {verdict.r2:.2f} over {verdict.steps} steps ({memory.source})",
        ))
        host = verdict.host
        if host is None:
            out.not_measured.append("Host memory between steps: this system offers no host measure (neither glibc's mallinfo2 nor /proc/self/statm), so only tensor bytes and held graphs were measured.")
        else:
            out.metrics.append(Metric(
                id="memory.host_growth",
                name="host memory between steps, growth",
                value=round(host.slope_bytes_per_step, 1),
                unit="bytes/step",
                threshold=HOST_MIN_SLOPE_BYTES,
                passed=not host.leak if host.leak or host.steps >= out.min_steps else None,
                note=f"{'grows' if host.leak else 'no growth'}: {host.reason}; r^2 {host.r2:.2f} over {host.steps} steps ({memory.host.source})",
            ))
        nodes = verdict.nodes
        out.metrics.append(Metric(
            id="memory.graph_nodes_growth",
            name="autograd nodes held between steps, growth",
            value=round(nodes.per_step, 1) if nodes.per_step is not None else None,
            unit="nodes/step",
            note=(
                f"held by {nodes.held_by}, counted at steps {', '.join(str(p[0]) for p in nodes.points)}" if nodes.held_by
                else "no named tensor or container was seen holding a growing autograd graph at the checks"
            ) + _graph_walk_note(profile),
        ))
        if verdict.steps < out.min_steps and not verdict.leak:
            out.not_measured.append(f"Memory leak: {verdict.reason}.")
        if out.device == "cpu":
            out.metrics.append(Metric(id=f"{perf_regression.PEAK_MEMORY_PREFIX}live_tensors", name="peak live tensor memory (instrumented run)", value=profile.memory.peak_tracked_bytes, unit="bytes", note="tracked tensor storages, AMP " + ("on" if out.flag else "as configured")))
        return Checked(leaks, memory)


class HostSyncs:
    """host-sync: syncs per step and call site, the target's and the libraries' apart."""

    name = "syncs"
    reads = (FULL,)

    def evaluate(self, out: PerformanceFacts) -> Checked:
        profile = out.profile
        steps = profile.clock.steps
        # On a heavy loop syncs are counted over the instrumented window only: rates are per counted step.
        sync_steps = min(steps, profile.syncs.steps_counted or steps)
        sync_summary, sync_findings = perf_sync.analyse(out.ctx, profile.syncs, sync_steps, out.device, _code_reader(out.ctx.root))
        out.metrics.append(Metric(id="syncs.target_per_step", name="host syncs per step, target code", value=round(sync_summary.target_per_step, 3), unit="syncs/step", note=sync_summary.counted_as))
        out.metrics.append(Metric(id="syncs.library_per_step", name="host syncs per step, inside library calls", value=round(sync_summary.library_per_step, 3), unit="syncs/step", note="made by torch or other libraries the loop calls; not reported as the target's defect"))
        return Checked(sync_findings, sync_summary)


class StepTime:
    """Step time per timing run: median and spread, or, with too few steps, the sign test
    against the baseline (perf-regression); the medians' spreads and the few-step comparisons
    are left in the facts for the regression check."""

    name = "timing"
    reads = (LIGHT,)

    def evaluate(self, out: PerformanceFacts) -> Checked:
        findings: list[Finding] = []
        timing_details: dict[str, StepRecord] = {}
        for label, run_clock in out.timings.items():
            stats = perf_timing.step_stats(run_clock, out.warmup, out.min_steps)
            if stats is None:
                findings += self._few_steps(out, label, run_clock)
                continue
            median_id, iqr_id = f"step_time.median.{label}", f"step_time.iqr.{label}"
            out.spreads[median_id] = iqr_id
            out.metrics.append(Metric(id=median_id, name=f"step time, median ({label})", value=round(stats.median_s * 1e3, 4), unit="ms", note=f"{stats.steps} steps after warm-up, {stats.clock} clock, on {out.device}"))
            out.metrics.append(Metric(id=iqr_id, name=f"step time, IQR ({label})", value=round(stats.iqr_s * 1e3, 4), unit="ms", note="interquartile range of the step times"))
            timing_details[label] = stats.record()
            if run_clock.peak_memory_bytes is not None:
                out.metrics.append(Metric(id=f"{perf_regression.PEAK_MEMORY_PREFIX}device.{label}", name=f"peak device memory ({label})", value=run_clock.peak_memory_bytes, unit="bytes", note="torch.cuda.max_memory_allocated"))
        return Checked(findings, timing_details)

    @staticmethod
    def _few_steps(out: PerformanceFacts, label: str, run_clock: StepClockRecord) -> list[Finding]:
        """Too few steps for a median, but every one of them may still be slower than the baseline."""
        times = perf_timing.step_times(run_clock, out.warmup)
        few, few_finding = perf_regression.few_steps(out.ctx, label, times, out.device, out.conditions)
        if isinstance(few, NotComparable):
            out.not_comparable.append(few)
            few = None
        if few is not None:
            out.few_step_rows.append(few)
        if few_finding is None:
            out.not_measured.append(f"Step time ({label}): not enough steps to decide ({len(times)} of {out.min_steps}) after warm-up" + (f"; {few.sign_test.statement}" if few and few.sign_test else "") + ".")
        return [few_finding] if few_finding else []


class MixedPrecision:
    """amp-*: AMP on vs off: speedup, memory, loss drift, and whether reduced precision ran at all."""

    name = "amp"
    reads = (FULL, LIGHT)

    def evaluate(self, out: PerformanceFacts) -> Checked:
        if not out.flag:
            test = out.ctx.config.entrypoint.test if out.ctx.config.entrypoint is not None else None
            out.not_measured.append(
                f"Mixed precision on vs off: {observed_test_note(test, 'runs with AMP switched on and off (entrypoint.amp_flag)')}."
                if test is not None else "Mixed precision on vs off: no entrypoint.amp_flag (amp_args for a script) is configured, so AMP was not compared."
            )
            return Checked()
        timings = out.timings
        if "fp32" not in timings or "amp" not in timings:
            return Checked()
        ctx, policy, clock = out.ctx, out.ctx.thresholds(PerformancePolicy), out.profile.clock
        amp_counts = out.profile.amp
        comparison = perf_amp.compare(timings["fp32"], timings["amp"], out.warmup, out.min_steps, out.device, perf_amp.amp_active(amp_counts), perf_amp.reduced_dtype(amp_counts))
        amp_metrics = perf_amp.metrics(comparison, policy, amp_counts)
        out.metrics += amp_metrics
        location = perf_amp.amp_location(amp_counts, clock.forward_sites)
        inactive, not_applicable = perf_amp.inactive_check(ctx, amp_counts, clock.forward_sites, out.flag, out.device)
        findings = [inactive] if inactive else []
        out.metrics += not_applicable
        accuracy = perf_amp.accuracy_finding(ctx, comparison, policy, location)
        findings += [accuracy] if accuracy else []
        findings += perf_amp.target_findings(ctx, comparison, policy, location)
        out.not_measured += [f"{m.name}: {m.note}." for m in amp_metrics if m.passed is None and m.threshold is not None]
        return Checked(findings, AmpDetails(**dict(comparison), counts=amp_counts, location=location))


class InputStall:
    """input-stall: the share of the step spent waiting on the DataLoader, in the primary timing run."""

    name = "stall"
    reads = (FULL, LIGHT)

    def evaluate(self, out: PerformanceFacts) -> Checked:
        primary, primary_clock = out.primary, out.primary_clock
        if primary_clock is None:
            return Checked()
        data_sites = perf_timing.sampled_sites(out.profile, "data", limit=5)
        stall, stall_finding = perf_timing.input_stall(out.ctx, primary_clock, out.warmup, out.min_steps, primary, data_sites)
        if stall.median_share is not None and stall.loader:
            decided = stall.decided
            test = stall.sign_test
            note = "time in DataLoader iteration / step time, host clock" + (f"; {test.statement}" if test else "")
            if not decided:
                note = f"not enough steps to decide ({stall.steps} of {stall.min_steps}); " + note
                out.not_measured.append(f"Input stall: not enough steps to decide ({stall.steps} of {stall.min_steps}), and the sign test was not decisive either way.")
            out.metrics.append(Metric(id=f"data_wait.share.{primary}", name=f"data wait share of the step, median ({primary})", value=round(stall.median_share, 4), unit="fraction", threshold=perf_timing.STALL_SHARE, passed=(stall_finding is None) if decided else None, note=note))
        if not stall.loader:
            out.not_measured.append("Input stall: the loop iterates no DataLoader, so data waits were not timed (the time before each forward is in the breakdown's rest).")
        return Checked([stall_finding] if stall_finding else [], stall)


class TimeBreakdown:
    """No finding of its own: where the primary timing run's step time goes (data, forward, backward, step, rest)."""

    name = "breakdown"
    reads = (FULL, LIGHT)

    def evaluate(self, out: PerformanceFacts) -> Checked:
        primary_clock = out.primary_clock
        if primary_clock is None:
            return Checked()
        return Checked(record=perf_timing.breakdown(primary_clock, out.warmup, out.primary, perf_timing.sampled_sites(out.profile, "rest")))


class Regression:
    """perf-regression against the baseline: the side-by-side timing, the stored numbers that
    compare, the few-step comparisons; what does not compare is listed as such."""

    name = "regression"
    reads = (LIGHT,)

    def evaluate(self, out: PerformanceFacts) -> Checked:
        regression, findings = perf_regression.compare(out.ctx, out.metrics, out.spreads, out.device, out.conditions)
        compared, note = list(regression.compared), regression.note
        environment = out.environment
        side = environment.side_by_side if environment else None
        if side is not None:
            finding = perf_regression.side_by_side(out.ctx, side, out.device)
            findings += [finding] if finding else []
            side_row = perf_regression.side_by_side_row(side)
            compared += [side_row] if side_row else []
            if side.verdict == "not measured":
                out.not_measured.append(f"Step time ({side.label}) against the baseline's code, timed beside it: not measured: {side.reason}.")
            note = None if side_row else note
        if out.few_step_rows:
            # A regressed few-step row is a comparison made, whatever the medians' note says.
            note = None if any(r.regressed for r in out.few_step_rows) else note
            compared += out.few_step_rows
        not_comparable = [*regression.not_comparable, *out.not_comparable]
        for skipped in not_comparable:
            out.not_measured.append(f"{skipped.metric} against the baseline report's: not comparable: {skipped.reason}.")
        if note:
            out.not_measured.append(f"Performance regression: {note}.")
        side_note = environment.side_note if environment else None
        details = RegressionDetails(compared=compared, note=note)
        # Only what there is (set fields only are dumped): a run without a baseline keeps the record it always had.
        if side is not None:
            details.side_by_side = side
        if not_comparable:
            details.not_comparable = not_comparable
        if side_note:
            details.side_by_side_note = side_note
        return Checked(findings, details)


def _graph_walk_note(profile: FullPayload) -> str:
    """On a loop whose one step's graph reaches the walk cap, node counts are lower bounds."""
    window = profile.instrumentation
    if not window.graph_walk_capped:
        return ""
    return f"; one step's autograd graph has at least {window.graph_walk_cap:,} nodes, where graph walks stop, so graphs held across steps are followed by the steps their nodes come from, not by node count, on this loop (retained bytes and host memory still are)"


def _code_reader(root: Path) -> Callable[[SiteKey], str]:
    cache: dict[str, list[str]] = {}

    def code_of(site: SiteKey) -> str:
        path, line = site[0], site[1]
        if path not in cache:
            try:
                cache[path] = (root / path).read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                cache[path] = []
        lines = cache[path]
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    return code_of


def _loop_site(clock: StepClockRecord) -> Location | None:
    """The training loop's model call: the most frequent outermost forward site."""
    return location_of(clock.forward_sites[0][0]) if clock.forward_sites else None
