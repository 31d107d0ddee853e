"""The performance stage: profile the training loop the entrypoint runs, as it is.

Child processes, each a fresh call of the configured entrypoint:
1. timing runs with the step clock only: AMP off and on when the target has an AMP flag,
   else one with its own settings; with a `--baseline` whose commit is in the clone, the
   baseline's code (its tree written out by `baseline_code`) alternates with this version's
   at the primary setting, A B A B, and `side_by_side` judges the step time from those runs.
   Each timing run is bracketed by readings of the machine's load (`load`). They run first,
   while no other stage runs; then the stage releases the machine (`machine_released`) and
   the stages waiting for it start beside the rest;
2. one instrumented run (AMP on when the target has an AMP flag): step clock, storage
   tracker, sync counter, sampler (stages/performance/probe/instrument.py:full). Nothing it
   measures is a time: memory, syncs and operator counts are the process's own, the
   sampler's shares are of its own steps.
From them: `memory-leak` (perf_memory), `host-sync` (perf_sync), `amp-*` (perf_amp),
`input-stall` and the time breakdown (perf_timing), `perf-regression` (perf_regression).
A run that overruns is a `hang`; one that crashes in the target's own code is an
`entrypoint-crash` at its line; one that fails otherwise, or trains without a single
optimizer step, is a blocking `stage-error`: nothing was profiled, and that never passes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from traingate.stages.performance.config import PerformanceConfig
from traingate.stages.performance.probe.payloads import PERFORMANCE_FULL as FULL, PERFORMANCE_LIGHT as LIGHT
from traingate.stages.performance.details import (
    DeviceKind,
    LoadRecord,
    PerformanceDetails,
    RegressionDetails,
    RunRecord,
    StepCounts,
    StepRecord,
)
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Metric, StageOutcome
from traingate.stages.performance import consistency as perf_consistency
from traingate.stages.performance import regression as perf_regression, timing as perf_timing
from traingate.stages.performance.probe.payloads import FullPayload, LightPayload, ProcessRecord, StepClockRecord
from traingate.stages.performance import baseline_code as perf_baseline_code, load as perf_load, notice as perf_notice, side_by_side as perf_side
from traingate.stages.performance.baseline_code import BaselineCode
from traingate.pipeline.model.findings import stopped_finding
from traingate.stages.base import EntrypointRun, PayloadModel, StageContext, location_of, run_entrypoint, with_leftover_findings
from traingate.stages.agent.crash import entrypoint_crash_finding, is_target_crash
from traingate.stages.agent.checks import Check, run_checks
from traingate.stages.performance.checks import HostSyncs, InputStall, PerformanceFacts, MemoryLeak, MixedPrecision, Regression, StepTime, TimeBreakdown, TimingEnvironment

# Every check of the stage, in the order it runs over what the instrumented run and the timing
# runs measured (`checks.py`); the regression check reads the step times measured before it.
CHECKS: tuple[Check[PerformanceFacts], ...] = (MemoryLeak(), HostSyncs(), StepTime(), MixedPrecision(), InputStall(), TimeBreakdown(), Regression())


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

        # The timed runs first, while no other stage runs beside them (`pipeline/gate/schedule.py`):
        # each run a fair share of the budget, what one leaves going to the ones after it.
        try:
            done = _time_runs(ctx, plan, baseline, reserve_s=ctx.child_budget() / (len(plan) + 1))
        finally:
            _remove(baseline)
        ctx.machine_released()  # what follows is not timed: the stages waiting may start beside it
        if isinstance(done, StageOutcome):
            return done
        profile_run = run_entrypoint(
            ctx, label="profile", amp=True if flag else None, instruments=[FULL],
            options={"warmup_steps": warmup, "min_steps": settings.min_steps}, budget_s=ctx.child_budget(),
            # Its dispatch mode sees every operator, and under autocast the values computed without
            # gradients come out otherwise (measured on the example: a validation loss 3e-5 off).
            alters_numerics=True,
        )
        profile = _measured(ctx, profile_run, FULL, FullPayload, "The instrumented training run", run_id="profile")
        if isinstance(profile, StageOutcome):
            return profile
        steps = profile.clock.steps
        if steps == 0:
            return _no_steps(ctx, profile_run, profile.clock)
        done.runs.append(_run_record("profile (instrumented)", True if flag else None, profile_run, steps))
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


def _time_runs(ctx: StageContext, plan: list[_Planned], baseline: BaselineCode | str | None, reserve_s: float) -> _TimingDone | StageOutcome:
    """Make the planned timing runs, each bracketed by readings of the machine's load, keeping
    `reserve_s` of the budget for the instrumented run after them."""
    done = _TimingDone(runs=[])
    base_ctx = _baseline_context(ctx, baseline) if isinstance(baseline, BaselineCode) else None
    for index, planned in enumerate(plan):
        if (planned.baseline or planned.extra) and (base_ctx is None or done.baseline_failed):
            continue
        left = len(plan) - index
        before = perf_load.sample()
        run_ctx = base_ctx if planned.baseline and base_ctx is not None else ctx
        prefix = "baseline-" if planned.baseline else ""
        share = max(0.0, ctx.child_budget() - reserve_s) / left
        run = run_entrypoint(run_ctx, label=f"{prefix}timing-{planned.label}", amp=planned.amp, instruments=[LIGHT], budget_s=share)
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


def _timing_environment(ctx: StageContext, done: _TimingDone, training_device: str, baseline: BaselineCode | str | None, settings: PerformanceConfig) -> TimingEnvironment:
    device = "cuda" if training_device.startswith("cuda") else "cpu"
    process = done.process
    machine = perf_load.machine(device, process.torch if process else None, process.device_name if process else None, wait_policy=ctx.child_env().get("OMP_WAIT_POLICY"))
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
    if 0 < steps <= settings.warmup_steps:
        # Every step was warm-up: nothing was measured, and that is not a pass.
        return StageOutcome(
            summary=f"not measured: {steps} optimizer step(s), all within the {settings.warmup_steps} warm-up steps",
            skipped_reason=(
                f"not measured: the instrumented run made {steps} optimizer step(s) on {device}, all within the first {settings.warmup_steps} "
                "it treats as warm-up, so no step time, memory growth or sync rate was measured; give the run more steps "
                "(the entrypoint's kwargs, or a test that trains longer) or lower [performance] warmup_steps"
            ),
            metrics=[Metric(id="steps.profiled", name="training steps observed", value=steps, unit="steps", note=f"all within the {settings.warmup_steps} warm-up steps: not measured")],
        )
    out = PerformanceFacts(ctx, device, settings.warmup_steps, settings.min_steps, profile, timings, flag, environment)
    out.metrics.append(Metric(
        id="steps.profiled", name="training steps observed", value=steps, unit="steps",
        note=f"optimizer steps in the instrumented run; the first {out.warmup} are warm-up" + _window_note(profile, steps),
    ))
    records = run_checks(CHECKS, out, out.findings)
    out.not_measured += perf_consistency.undecided_misses(out.metrics, out.findings)
    timing_details: dict[str, StepRecord] = records[StepTime.name]
    regression: RegressionDetails = records[Regression.name]
    details = PerformanceDetails(
        device=clock.training_device,
        device_kind=device,
        steps=StepCounts(observed=steps, warmup=out.warmup, profiled=max(0, steps - out.warmup), truncated=clock.truncated, instrumented=_instrumented_steps(profile, steps)),
        instrumentation=profile.instrumentation,
        runs=runs,
        memory=records[MemoryLeak.name],
        syncs=records[HostSyncs.name],
        amp=records[MixedPrecision.name],
        amp_flag=flag,
        timing=timing_details,
        breakdown=records[TimeBreakdown.name],
        stall=records[InputStall.name],
        regression=regression,
        not_measured=out.not_measured,
        instrument_s=profile.instrument_s,
        machine=environment.timings.machine if environment else None,
        timing_notice=perf_notice.timing_notice(ctx.baseline is not None, regression),
    )
    summary = _summary(steps, out.warmup, device, out.findings, timing_details)
    return StageOutcome(summary=summary, metrics=out.metrics, findings=out.findings, details=details.data())


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


def _measured(ctx: StageContext, run: EntrypointRun, spec: str, model: type[PayloadModel], what: str, run_id: str) -> PayloadModel | StageOutcome:
    """The run's payload for `spec`; or, for a run that overran, raised, died or lost its
    instrument, the outcome that says so: nothing it measured counts. `run_id` names the run
    in the finding's fingerprint."""
    if run.child.timed_out:
        return StageOutcome(summary=f"{what} overran its budget", findings=[stopped_finding(ctx, run.child, what, run=run_id, progress=run.progress)])
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
        last = error.strip().splitlines()[-1] if error and error.strip() else ""
        problem = f"{what} finished, but its instrument reported no data" + (f" ({last[:300]})" if last else "")
        traceback, location = error, None
    else:
        problem = f"{what} {run.failure()}"
        exc = run.raised
        traceback = (exc.traceback if exc is not None else None) or (run.child.stderr[-8000:] or None)
        location = location_of(exc.target_frame if exc is not None and not exc.raised_in_gate else None)
        if exc is not None and exc.raised_in_gate:
            problem = f"{what}: traingate's instrument raised inside the target's call ({exc.type}: {exc.message[:200]})"
            traceback = run.instrument_error(spec) or traceback
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
