"""The performance stage: profile the training loop the entrypoint runs, as it is.

Child processes, each a fresh call of the configured entrypoint:
1. one instrumented run (AMP on when the target has an AMP flag): step clock, storage
   tracker, sync counter, sampler (stages/performance/probe/instrument.py:full);
2. timing runs with the step clock only: AMP off and on when the target has an AMP flag,
   else one with its own settings; with a `--baseline` whose commit is in the clone, the
   baseline's code (its tree written out by `baseline_code`) alternates with this version's
   at the primary setting, A B A B, and `side_by_side` judges the step time from those runs.
   Each timing run is bracketed by readings of the machine's load (`load`).
From them: `memory-leak` (perf_memory), `host-sync` (perf_sync), `amp-*` (perf_amp),
`input-stall` and the time breakdown (perf_timing), `perf-regression` (perf_regression).
A run that overruns is a `hang`; one that crashes in the target's own code is an
`entrypoint-crash` at its line; one that fails otherwise, or trains without a single
optimizer step, is a blocking `stage-error`: nothing was profiled, and that never passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from collections.abc import Callable
from pathlib import Path

from traingate.stages.performance.config import PerformanceConfig
from traingate.stages.performance.probe.payloads import PERFORMANCE_FULL as FULL, PERFORMANCE_LIGHT as LIGHT
from traingate.stages.performance.details import (
    AmpDetails,
    Breakdown,
    DeviceKind,
    LoadRecord,
    MemoryDetails,
    NotComparable,
    PerformanceDetails,
    RegressionDetails,
    RegressionRow,
    RunRecord,
    SideBySide,
    StallDetails,
    StepCounts,
    StepRecord,
    SyncSummary,
)
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Metric, StageOutcome
from traingate.stages.performance import consistency as perf_consistency
from traingate.stages.performance import amp as perf_amp, memory as perf_memory, regression as perf_regression, sync as perf_sync, timing as perf_timing
from traingate.stages.performance.probe.payloads import FullPayload, LightPayload, ProcessRecord, SiteKey, StepClockRecord
from traingate.stages.performance import baseline_code as perf_baseline_code, load as perf_load, notice as perf_notice, side_by_side as perf_side
from traingate.stages.performance.baseline_code import BaselineCode
from traingate.stages.observed_test import observed_test_note
from traingate.stages.base import EntrypointRun, PayloadModel, StageContext, hang_finding, location_of, run_entrypoint, with_leftover_findings
from traingate.stages.crash import entrypoint_crash_finding, is_target_crash
from traingate.stages.performance.leak import HOST_MIN_SLOPE_BYTES, MIN_SLOPE_BYTES



class PerformanceWork:
    """The stage's work, run in its agent (`traingate.stages.performance.spec.PerformanceStage` is what the gate registers)."""

    def run(self, ctx: StageContext) -> StageOutcome:
        return with_leftover_findings(ctx, self._profile(ctx))

    def _profile(self, ctx: StageContext) -> StageOutcome:
        entrypoint = ctx.config.entrypoint
        if entrypoint is None:
            return StageOutcome(
                summary="nothing to profile",
                skipped_reason="no entrypoint is configured ([tool.traingate.entrypoint] call = \"module:function\"), so there is no training loop to profile",
            )
        flag = entrypoint.amp_switch  # the keyword, or `amp_args` for a script
        settings = ctx.section(PerformanceConfig)
        warmup = settings.warmup_steps
        baseline = _baseline_code(ctx)
        plan = _timing_plan(flag, settings.timing_runs, baseline)

        profile_run = run_entrypoint(
            ctx, label="profile", amp=True if flag else None, instruments=[FULL],
            options={"warmup_steps": warmup, "min_steps": settings.min_steps}, budget_s=ctx.child_budget() * (0.6 if len(plan) > 1 else 0.7),
        )
        profile = _measured(ctx, profile_run, FULL, FullPayload, "The instrumented training run", run_id="profile")
        if isinstance(profile, StageOutcome):
            _remove(baseline)
            return profile
        steps = profile.clock.steps
        if steps == 0:
            _remove(baseline)
            return _no_steps(ctx, profile_run, profile.clock)
        try:
            done = _time_runs(ctx, plan, baseline, _run_record("profile (instrumented)", True if flag else None, profile_run, steps))
        finally:
            _remove(baseline)
        if isinstance(done, StageOutcome):
            return done
        environment = _timing_environment(ctx, done, profile.clock.training_device, baseline, settings)
        return analyse(ctx, profile, {k: _fastest(v, warmup) for k, v in done.timings.items()}, done.runs, flag, environment)


@dataclass(frozen=True)
class _Planned:
    """One timing run to make: its setting, and whether it runs the baseline's code."""

    label: str
    amp: bool | None
    baseline: bool = False
    extra: bool = False  # a run of this version made only to be timed beside the baseline's


@dataclass
class _TimingDone:
    """What the timing runs measured, in the order they ran."""

    runs: list[RunRecord]
    timings: dict[str, list[StepClockRecord]] = field(default_factory=dict)
    side_runs: list[tuple[_Planned, LightPayload]] = field(default_factory=list)
    loads: list[LoadRecord] = field(default_factory=list)
    process: ProcessRecord | None = None
    baseline_failed: str | None = None


def _timing_plan(flag: str | None, repeats: int, baseline: BaselineCode | str | None) -> list[_Planned]:
    """The timing runs: each setting `repeats` times; with the baseline's code, the primary
    setting alternates with the baseline's, A B A B (at least two of each), after the others."""
    settings: list[tuple[str, bool | None]] = [("fp32", False), ("amp", True)] if flag else [("default", None)]
    if not isinstance(baseline, BaselineCode):
        return [_Planned(label, amp) for label, amp in settings for _ in range(repeats)]
    primary, amp = settings[-1]
    base_amp = True if baseline.entrypoint.amp_switch else None
    others = [_Planned(label, a) for label, a in settings[:-1] for _ in range(repeats)]
    pairs = [(_Planned(primary, base_amp, baseline=True), _Planned(primary, amp, extra=index >= repeats)) for index in range(max(2, repeats))]
    return others + [run for pair in pairs for run in pair]


def _time_runs(ctx: StageContext, plan: list[_Planned], baseline: BaselineCode | str | None, profile_record: RunRecord) -> _TimingDone | StageOutcome:
    """Make the planned timing runs, each bracketed by readings of the machine's load."""
    done = _TimingDone(runs=[profile_record])
    base_ctx = _baseline_context(ctx, baseline) if isinstance(baseline, BaselineCode) else None
    for index, planned in enumerate(plan):
        if (planned.baseline or planned.extra) and (base_ctx is None or done.baseline_failed):
            continue
        left = len(plan) - index
        before = perf_load.sample()
        run_ctx = base_ctx if planned.baseline and base_ctx is not None else ctx
        prefix = "baseline-" if planned.baseline else ""
        run = run_entrypoint(run_ctx, label=f"{prefix}timing-{planned.label}", amp=planned.amp, instruments=[LIGHT], budget_s=ctx.child_budget() / left)
        if planned.baseline or planned.extra:
            # Made only for the side-by-side timing: one that fails leaves it not measured, never a finding.
            side_light = run.payload(LIGHT, LightPayload) if run.ok else None
            if side_light is None:
                whose = "the baseline's timing run" if planned.baseline else "this version's second timing run"
                done.baseline_failed = f"{whose} {run.failure() or 'handed back no step times'}"
                continue
            if planned.extra:
                done.timings.setdefault(planned.label, []).append(side_light.clock)
            light: LightPayload | StageOutcome = side_light
        else:
            light = _measured(ctx, run, LIGHT, LightPayload, f"The {planned.label} timing run", run_id=f"timing-{planned.label}")
            if isinstance(light, StageOutcome):
                return light
            done.timings.setdefault(planned.label, []).append(light.clock)
            done.process = done.process or light.process
        assert isinstance(light, LightPayload)
        load = perf_load.load_between(before, perf_load.sample(), light.process.cpu_s if light.process else None, perf_load.usable_cpus())
        done.loads.append(load)
        done.side_runs.append((planned, light))
        name = f"baseline timing ({planned.label})" if planned.baseline else f"timing ({planned.label})"
        done.runs.append(_run_record(name, planned.amp, run, light.clock.steps, load))
    return done


@dataclass(frozen=True)
class TimingEnvironment:
    """Where the timing runs ran and what the baseline's code measured beside them."""

    timings: perf_regression.Timings
    side_by_side: SideBySide | None = None
    side_note: str | None = None  # why the baseline's code was not timed beside this version's


def _timing_environment(ctx: StageContext, done: _TimingDone, training_device: str, baseline: BaselineCode | str | None, settings: PerformanceConfig) -> TimingEnvironment:
    device = "cuda" if training_device.startswith("cuda") else "cpu"
    process = done.process
    machine = perf_load.machine(device, process.torch if process else None, process.device_name if process else None)
    shares = [load.other_cpu_share for load in done.loads if load.other_cpu_share is not None]
    quiet = bool(done.loads) and all(load.quiet for load in done.loads)
    averages = [load.loadavg for load in done.loads if load.loadavg is not None]
    note = (f"other processes took up to {max(shares):.0%} of its CPU time" if shares else "its load could not be read") + (f", load average up to {max(averages):.1f}" if averages else "")
    side, side_note = None, None
    if isinstance(baseline, BaselineCode):
        if done.baseline_failed:
            side_note = done.baseline_failed
        else:
            primary = [(p, light) for p, light in done.side_runs if p.label == _primary(done)]
            side = perf_side.judge(baseline.commit, _primary(done), _side_runs(primary, settings.warmup_steps, device), settings.min_steps)
    elif ctx.baseline is not None:
        side_note = baseline
    judged = {side.label} if side is not None else set()
    return TimingEnvironment(perf_regression.Timings(machine, quiet, note, judged), side, side_note)


def _primary(done: _TimingDone) -> str:
    return "amp" if "amp" in done.timings else next(iter(done.timings), "default")


def _side_runs(runs: list[tuple[_Planned, LightPayload]], warmup: int, device: str) -> list[perf_side.SideRun]:
    """The primary setting's runs of both versions, in order, named A1, B1, A2, ... (A the baseline)."""
    counts = {True: 0, False: 0}
    out = []
    for planned, light in runs:
        counts[planned.baseline] += 1
        clock = light.clock
        times = {"cuda events" if clock.device is not None else "wall clock": perf_timing.step_times(clock, warmup)}
        if device == "cpu" and light.process is not None and len(light.process.cpu_step) == clock.steps:
            times[perf_side.PROCESS_CPU] = perf_timing.profiled(light.process.cpu_step, warmup)
        out.append(perf_side.SideRun(label=f"{'A' if planned.baseline else 'B'}{counts[planned.baseline]}", baseline=planned.baseline, times=times))
    return out


def _baseline_code(ctx: StageContext) -> BaselineCode | str | None:
    """The baseline's code to time beside this version's; why not (a sentence); None without a baseline."""
    if ctx.baseline is None:
        return None
    return perf_baseline_code.checkout(ctx.origin, ctx.baseline.target.commit, ctx.root.name)


def _baseline_context(ctx: StageContext, baseline: BaselineCode) -> StageContext:
    """`ctx` for the baseline's runs: its tree and entrypoint, records of its own."""
    config = ctx.config.model_copy(update={"entrypoint": baseline.entrypoint})
    return replace(ctx, root=baseline.root, config=config, entrypoint_runs=[], files_read=[], training_stopped=[])


def _remove(baseline: BaselineCode | str | None) -> None:
    if isinstance(baseline, BaselineCode):
        baseline.remove()


@dataclass
class _Measured:
    """What the sections of the analysis add up: findings, metrics, and what was not measured."""

    ctx: StageContext
    device: str
    warmup: int
    min_steps: int
    environment: TimingEnvironment | None = None
    findings: list[Finding] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    not_measured: list[str] = field(default_factory=list)
    not_comparable: list[NotComparable] = field(default_factory=list)  # stored step times with too few steps for a median

    @property
    def timings(self) -> perf_regression.Timings | None:
        return self.environment.timings if self.environment else None


def analyse(
    ctx: StageContext, profile: FullPayload, timings: dict[str, StepClockRecord], runs: list[RunRecord], flag: str | None, environment: TimingEnvironment | None = None,
) -> StageOutcome:
    """Findings, metrics and report details from what the runs measured; `environment`: where
    the timing runs ran and the side-by-side verdict (None: not recorded, so no stored step
    time compares)."""
    settings = ctx.section(PerformanceConfig)
    clock = profile.clock
    steps = clock.steps
    device: DeviceKind = "cuda" if clock.training_device.startswith("cuda") else "cpu"
    out = _Measured(ctx, device, settings.warmup_steps, settings.min_steps, environment)
    out.metrics.append(Metric(
        id="steps.profiled", name="training steps observed", value=steps, unit="steps",
        note=f"optimizer steps in the instrumented run; the first {out.warmup} are warm-up" + _window_note(profile, steps),
    ))
    memory = _memory_section(out, profile, flag)
    sync_summary = _sync_section(out, profile, steps)
    spreads, timing_details, few_step_rows = _timing_section(out, timings)
    amp_details = _amp_section(out, profile, timings, flag)
    stall, breakdown = _stall_section(out, profile, timings, flag)
    regression = _regression_section(out, spreads, few_step_rows)
    out.not_measured += perf_consistency.undecided_misses(out.metrics, out.findings)
    details = PerformanceDetails(
        device=clock.training_device,
        device_kind=device,
        steps=StepCounts(observed=steps, warmup=out.warmup, profiled=max(0, steps - out.warmup), truncated=clock.truncated, instrumented=_instrumented_steps(profile, steps)),
        instrumentation=profile.instrumentation,
        runs=runs,
        memory=memory,
        syncs=sync_summary,
        amp=amp_details,
        amp_flag=flag,
        timing=timing_details,
        breakdown=breakdown,
        stall=stall,
        regression=regression,
        not_measured=out.not_measured,
        instrument_s=profile.instrument_s,
        machine=environment.timings.machine if environment else None,
        timing_notice=perf_notice.timing_notice(ctx.baseline is not None, regression),
    )
    summary = _summary(steps, out.warmup, device, out.findings, timing_details)
    return StageOutcome(summary=summary, metrics=out.metrics, findings=out.findings, details=details.data())


def _memory_section(out: _Measured, profile: FullPayload, flag: str | None) -> MemoryDetails:
    """memory-leak: one verdict over tensor bytes, held graphs and host memory, a metric each."""
    memory, leaks = perf_memory.analyse(out.ctx, profile.memory, out.warmup, out.min_steps, out.device, _loop_site(profile.clock))
    out.findings += leaks
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
        out.metrics.append(Metric(id=f"{perf_regression.PEAK_MEMORY_PREFIX}live_tensors", name="peak live tensor memory (instrumented run)", value=profile.memory.peak_tracked_bytes, unit="bytes", note="tracked tensor storages, AMP " + ("on" if flag else "as configured")))
    return memory


def _sync_section(out: _Measured, profile: FullPayload, steps: int) -> SyncSummary:
    """host-sync: syncs per step and call site, the target's and the libraries' apart."""
    # On a heavy loop syncs are counted over the instrumented window only: rates are per counted step.
    sync_steps = min(steps, profile.syncs.steps_counted or steps)
    sync_summary, sync_findings = perf_sync.analyse(out.ctx, profile.syncs, sync_steps, out.device, _code_reader(out.ctx.root))
    out.findings += sync_findings
    out.metrics.append(Metric(id="syncs.target_per_step", name="host syncs per step, target code", value=round(sync_summary.target_per_step, 3), unit="syncs/step", note=sync_summary.counted_as))
    out.metrics.append(Metric(id="syncs.library_per_step", name="host syncs per step, inside library calls", value=round(sync_summary.library_per_step, 3), unit="syncs/step", note="made by torch or other libraries the loop calls; not reported as the target's defect"))
    return sync_summary


def _timing_section(out: _Measured, timings: dict[str, StepClockRecord]) -> tuple[dict[str, str], dict[str, StepRecord], list[RegressionRow]]:
    """Step time per timing run: median and spread, or, with too few steps, the sign test
    against the baseline. Returns the median->spread metric ids, the per-run statistics and
    the few-step comparisons."""
    spreads: dict[str, str] = {}
    timing_details: dict[str, StepRecord] = {}
    few_step_rows: list[RegressionRow] = []
    for label, run_clock in timings.items():
        stats = perf_timing.step_stats(run_clock, out.warmup, out.min_steps)
        if stats is None:
            # Too few steps for a median, but every one of them may still be slower than the baseline.
            few, few_finding = perf_regression.few_steps(out.ctx, label, perf_timing.step_times(run_clock, out.warmup), out.device, out.timings)
            out.findings += [few_finding] if few_finding else []
            if isinstance(few, NotComparable):
                out.not_comparable.append(few)
                few = None
            if few is not None:
                few_step_rows.append(few)
            if few_finding is None:
                out.not_measured.append(f"Step time ({label}): not enough steps to decide ({len(perf_timing.step_times(run_clock, out.warmup))} of {out.min_steps}) after warm-up" + (f"; {few.sign_test.statement}" if few and few.sign_test else "") + ".")
            continue
        median_id, iqr_id = f"step_time.median.{label}", f"step_time.iqr.{label}"
        spreads[median_id] = iqr_id
        out.metrics.append(Metric(id=median_id, name=f"step time, median ({label})", value=round(stats.median_s * 1e3, 4), unit="ms", note=f"{stats.steps} steps after warm-up, {stats.clock} clock, on {out.device}"))
        out.metrics.append(Metric(id=iqr_id, name=f"step time, IQR ({label})", value=round(stats.iqr_s * 1e3, 4), unit="ms", note="interquartile range of the step times"))
        timing_details[label] = stats.record()
        if run_clock.peak_memory_bytes is not None:
            out.metrics.append(Metric(id=f"{perf_regression.PEAK_MEMORY_PREFIX}device.{label}", name=f"peak device memory ({label})", value=run_clock.peak_memory_bytes, unit="bytes", note="torch.cuda.max_memory_allocated"))
    return spreads, timing_details, few_step_rows


def _amp_section(out: _Measured, profile: FullPayload, timings: dict[str, StepClockRecord], flag: str | None) -> AmpDetails | None:
    """AMP on vs off: speedup, memory, loss drift, and whether reduced precision ran at all."""
    if not flag:
        test = out.ctx.config.entrypoint.test if out.ctx.config.entrypoint is not None else None
        out.not_measured.append(
            f"Mixed precision on vs off: {observed_test_note(test, 'runs with AMP switched on and off (entrypoint.amp_flag)')}."
            if test is not None else "Mixed precision on vs off: no entrypoint.amp_flag (amp_args for a script) is configured, so AMP was not compared."
        )
        return None
    if "fp32" not in timings or "amp" not in timings:
        return None
    ctx, policy, clock = out.ctx, out.ctx.config.policy, profile.clock
    amp_counts = profile.amp
    comparison = perf_amp.compare(timings["fp32"], timings["amp"], out.warmup, out.min_steps, out.device, perf_amp.amp_active(amp_counts))
    amp_metrics = perf_amp.metrics(comparison, policy, amp_counts)
    out.metrics += amp_metrics
    location = perf_amp.amp_location(amp_counts, clock.forward_sites)
    inactive, not_applicable = perf_amp.inactive_check(ctx, amp_counts, clock.forward_sites, flag, out.device)
    out.findings += [inactive] if inactive else []
    out.metrics += not_applicable
    accuracy = perf_amp.accuracy_finding(ctx, comparison, policy, location)
    out.findings += [accuracy] if accuracy else []
    out.findings += perf_amp.target_findings(ctx, comparison, policy, location)
    out.not_measured += [f"{m.name}: {m.note}." for m in amp_metrics if m.passed is None and m.threshold is not None]
    return AmpDetails(**dict(comparison), counts=amp_counts, location=location)


def _stall_section(out: _Measured, profile: FullPayload, timings: dict[str, StepClockRecord], flag: str | None) -> tuple[StallDetails | None, Breakdown | None]:
    """input-stall and the step's time breakdown, from the primary timing run."""
    primary = "amp" if flag else "default"
    primary_clock = timings.get(primary) or next(iter(timings.values()), None)
    if primary_clock is None:
        return None, None
    data_sites = perf_timing.sampled_sites(profile, "data", limit=5)
    stall, stall_finding = perf_timing.input_stall(out.ctx, primary_clock, out.warmup, out.min_steps, primary, data_sites)
    out.findings += [stall_finding] if stall_finding else []
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
    return stall, perf_timing.breakdown(primary_clock, out.warmup, primary, perf_timing.sampled_sites(profile, "rest"))


def _regression_section(out: _Measured, spreads: dict[str, str], few_step_rows: list[RegressionRow]) -> RegressionDetails:
    """perf-regression against the baseline: the side-by-side timing, the stored numbers
    that compare, the few-step comparisons; what does not compare is listed as such."""
    regression, regression_findings = perf_regression.compare(out.ctx, out.metrics, spreads, out.device, out.timings)
    out.findings += regression_findings
    compared, note = list(regression.compared), regression.note
    environment = out.environment
    side = environment.side_by_side if environment else None
    if side is not None:
        finding = perf_regression.side_by_side(out.ctx, side, out.device)
        out.findings += [finding] if finding else []
        side_row = perf_regression.side_by_side_row(side)
        compared += [side_row] if side_row else []
        if side.verdict == "not measured":
            out.not_measured.append(f"Step time ({side.label}) against the baseline's code, timed beside it: not measured: {side.reason}.")
        note = None if side_row else note
    if few_step_rows:
        # A regressed few-step row is a comparison made, whatever the medians' note says.
        note = None if any(r.regressed for r in few_step_rows) else note
        compared += few_step_rows
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
    return details


def _summary(steps: int, warmup: int, device: str, findings: list[Finding], timing: dict[str, StepRecord]) -> str:
    times = ", ".join(f"{label} {t.median_ms:.2f} ms/step" for label, t in timing.items())
    found = ", ".join(sorted({f.category.value for f in findings})) or "no findings"
    return f"Profiled {max(0, steps - warmup)} training steps (after {warmup} warm-up) on {device}" + (f"; {times}" if times else "") + f"; {found}."


def _instrumented_steps(profile: FullPayload, steps: int) -> int:
    """Steps whose operators the storage tracker and the sync counter saw (all of them
    unless the loop was heavy enough for a bounded window)."""
    return profile.instrumentation.instrumented_steps or steps


def _window_note(profile: FullPayload, steps: int) -> str:
    counted = _instrumented_steps(profile, steps)
    if counted >= steps:
        return ""
    window = profile.instrumentation
    note = f"; about {window.ops_per_step or 0:,} operators per step, so memory and syncs were measured over the first {counted} steps only (step times over all)"
    if window.ended_steady:
        note += f"; the window ended before its {window.window_planned} steps because held memory, retained tensors and syncs per step did not change over them"
    return note


def _graph_walk_note(profile: FullPayload) -> str:
    """On a loop whose one step's graph reaches the walk cap, node counts are lower bounds."""
    window = profile.instrumentation
    if not window.graph_walk_capped:
        return ""
    return f"; one step's autograd graph has at least {window.graph_walk_cap:,} nodes, where graph walks stop, so graphs held across steps are followed by the steps their nodes come from, not by node count, on this loop (retained bytes and host memory still are)"


def _fastest(clocks: list[StepClockRecord], warmup: int) -> StepClockRecord:
    """With several timing runs per setting, the one with the lowest median step time (the
    least disturbed by the machine's other load)."""
    def key(clock: StepClockRecord) -> float:
        stats = perf_timing.step_stats(clock, warmup, 1)
        return stats.median_s if stats else float("inf")

    return min(clocks, key=key)


def _run_record(label: str, amp: bool | None, run: EntrypointRun, steps: int, load: LoadRecord | None = None) -> RunRecord:
    record = RunRecord(label=label, amp=amp, steps=steps, duration_s=round(run.child.duration_s, 3))
    return record.model_copy(update={"load": load}) if load is not None else record


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


def _measured(ctx: StageContext, run: EntrypointRun, spec: str, model: type[PayloadModel], what: str, run_id: str) -> PayloadModel | StageOutcome:
    """The run's payload for `spec`; or, for a run that overran, raised, died or lost its
    instrument, the outcome that says so: nothing it measured counts. `run_id` names the run
    in the finding's fingerprint."""
    if run.child.timed_out:
        return StageOutcome(summary=f"{what} overran its budget", findings=[hang_finding(ctx, run.child, what, run=run_id)])
    payload = run.payload(spec, model) if run.ok else None
    if payload is not None:
        return payload
    if is_target_crash(ctx, run):
        # The target's own code crashed: its defect, at its line, not a failure of the gate.
        crash = entrypoint_crash_finding(ctx, run, f"The performance stage's {what[4:] if what.startswith('The ') else what} of {_entrypoint_label(ctx)}")
        return StageOutcome(summary=f"{what} crashed in the target's code", findings=[crash])
    if run.ok:
        # The instrument's collect() raised: its traceback is all the run handed back for it.
        error = run.instrument_error(spec)
        problem = f"{what} finished, but its instrument reported no data" + (f": {error[-500:]}" if error else "")
        traceback, location = error, None
    else:
        problem = f"{what} {run.failure()}"
        exc = run.raised
        traceback = (exc.traceback if exc is not None else None) or (run.child.stderr[-8000:] or None)
        location = location_of(exc.target_frame if exc is not None else None)
    finding = ctx.stage_error(
        f"{what} failed",
        reason="profiling-failed",
        key=run_id,
        title=f"Profiling failed: {problem[:160]}",
        location=location,
        problem=f"{problem}. Nothing about this version's performance was measured.",
        impact="The gate cannot vouch for the training loop's performance, so it blocks (fail closed).",
        fix="Make the entrypoint run to completion with the configured kwargs (see the traceback); if it runs outside traingate, report this as a traingate defect.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=problem[:300], traceback=traceback, data={"returncode": run.child.returncode, "phase": run.record.phase if run.record is not None else None}),
    )
    return StageOutcome(summary=f"{what} failed", findings=[finding])


def _entrypoint_label(ctx: StageContext) -> str:
    ep = ctx.config.entrypoint
    return ep.label if ep is not None else "the entrypoint"


def _no_steps(ctx: StageContext, run: EntrypointRun, clock: StepClockRecord) -> StageOutcome:
    """Zero optimizer steps: there was no training step to profile; that never passes."""
    record = run.record
    called = record.duration_s if record is not None else 0.0
    seen = f"{clock.training_forwards} forward passes with gradients and {clock.backward_calls} backward calls"
    finding = ctx.stage_error(
        "no optimizer step",
        reason="no-optimizer-step",
        title="The entrypoint ran without a single optimizer step: nothing was profiled",
        problem=(
            f"The entrypoint returned after {called:.2f}s without calling `step()` on any torch.optim optimizer ({seen} were seen), "
            "so there was no training step to measure memory, syncs, mixed precision or data loading on. "
            "Parameters updated by hand, outside torch.optim, are not recognised as training steps."
        ),
        impact="A performance verdict without a single measured step would be a guess; the gate blocks instead (fail closed).",
        fix="Point [tool.traingate.entrypoint] at the function that trains, with kwargs that make it take at least a few optimizer steps.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"0 optimizer steps observed; {seen}",
            data={"call_s": round(called, 3), "backward_calls": clock.backward_calls, "training_forwards": clock.training_forwards, "returned": record.returned if record is not None else None},
        ),
    )
    return StageOutcome(summary="no training step to profile", findings=[finding])


def _loop_site(clock: StepClockRecord) -> Location | None:
    """The training loop's model call: the most frequent outermost forward site."""
    return location_of(clock.forward_sites[0][0]) if clock.forward_sites else None
