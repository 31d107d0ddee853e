"""A busy machine is not a slower change: the side-by-side verdict, the rule for stored step
times, the load readings and the baseline's tree, on hand-made inputs (no gate run)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from tests.stages.performance.measurements import MACHINE, QUIET_RUN, as_report, baseline_with, quiet_timings
from traingate.stages.performance import baseline_code, load as perf_load, regression as perf_regression, side_by_side as perf_side
from traingate.stages.performance.config import PerformancePolicy
from traingate.stages.performance.details import MachineRecord, NotComparable, RegressionDetails
from traingate.stages.performance.notice import timing_notice

STEP_S = 0.01


def steps(scale: float, n: int = 30, jitter: float = 0.03, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [STEP_S * scale * (1 + rng.uniform(-jitter, jitter)) for _ in range(n)]


def runs(scales: list[float], cpu: list[float] | None = None) -> list[perf_side.SideRun]:
    """Runs A1, B1, A2, B2, ... whose wall-clock steps are `scales` x STEP_S (and CPU time `cpu` x)."""
    out = []
    for index, scale in enumerate(scales):
        baseline = index % 2 == 0
        times = {"wall clock": steps(scale, seed=index)}
        if cpu is not None:
            times[perf_side.PROCESS_CPU] = steps(cpu[index], seed=100 + index)
        out.append(perf_side.SideRun(label=f"{'A' if baseline else 'B'}{index // 2 + 1}", baseline=baseline, times=times))
    return out


def test_a_slower_change_is_slower_in_every_adjacent_pair() -> None:
    result = perf_side.judge("abc123", "default", runs([1.0, 1.5, 1.0, 1.5]), min_steps=8)
    assert result.verdict == "slower"
    [measure] = result.measures
    assert [p.runs for p in measure.pairs] == [["A1", "B1"], ["B1", "A2"], ["A2", "B2"]]
    assert all(p.spread.low > 1.1 for p in measure.pairs)
    assert result.current_step_ms == pytest.approx(15.0, rel=0.05) and result.baseline_step_ms == pytest.approx(10.0, rel=0.05)


def test_the_same_code_on_a_quiet_machine_is_not_slower() -> None:
    assert perf_side.judge("abc123", "default", runs([1.0, 1.01, 0.99, 1.0]), min_steps=8).verdict == "not slower"


@pytest.mark.parametrize(
    ("scales", "what"),
    [
        ([1.0, 2.0, 3.0, 4.0], "load rising through the runs"),
        ([4.0, 3.0, 2.0, 1.0], "load falling through the runs"),
        ([1.0, 5.0, 1.0, 1.0], "a burst of load on one run of this version"),
        ([1.0, 5.0, 6.0, 5.0], "load arriving after the first run"),
        ([1.0, 1.5, 0.6, 1.2], "whole runs shifted by the machine, this version's a little more"),
    ],
)
def test_load_that_moves_through_the_runs_is_never_slower(scales: list[float], what: str) -> None:
    result = perf_side.judge("abc123", "default", runs(scales), min_steps=8)
    assert result.verdict == "not measured", what
    assert "noise covers the 10%" in result.reason or "load, not code, can explain it" in result.reason


def test_process_cpu_time_judges_where_the_wall_clock_is_too_noisy() -> None:
    # Wall clock moved by load (B1 caught a burst); the process's CPU time per step did not.
    steady = perf_side.judge("abc123", "default", runs([1.0, 4.0, 1.2, 1.1], cpu=[1.0, 1.0, 1.0, 1.0]), min_steps=8)
    assert steady.verdict == "not slower"
    assert "process CPU time" in steady.reason and "waiting rather than computing" in steady.reason
    # A change that computes three times as much is slower by its CPU time, however noisy the wall clock.
    heavier = perf_side.judge("abc123", "default", runs([1.0, 4.0, 1.2, 3.1], cpu=[1.0, 3.0, 1.0, 3.0]), min_steps=8)
    assert heavier.verdict == "slower" and {m.measure: m.verdict for m in heavier.measures}[perf_side.PROCESS_CPU] == "slower"


def test_too_few_steps_are_not_measured() -> None:
    short = [perf_side.SideRun(label=f"R{i}", baseline=i % 2 == 0, times={"wall clock": steps(1.0 + i, n=4)}) for i in range(4)]
    result = perf_side.judge("abc123", "default", short, min_steps=8)
    assert result.verdict == "not measured" and "too few steps" in result.reason


def test_a_side_by_side_slowdown_is_a_blocking_finding_with_both_versions_runs(tmp_path: Path) -> None:
    from tests.stages.performance.measurements import make_ctx

    ctx = make_ctx(tmp_path, baseline_with([]))
    result = perf_side.judge("0123456789abcdef", "default", runs([1.0, 3.0, 1.0, 3.0]), min_steps=8)
    finding = perf_regression.side_by_side(ctx, result, "cpu")
    assert finding is not None and finding.blocking and finding.category.value == "perf-regression"
    assert finding.evidence.data["ratio"] > 2.5 and finding.evidence.data["side_by_side"]["order"] == ["A1", "B1", "A2", "B2"]
    assert "timed alternately in this run" in finding.problem and "0123456789ab" in finding.problem
    assert perf_regression.side_by_side(ctx, perf_side.judge("0123456789abcdef", "default", runs([1.0, 1.0, 1.0, 1.0]), min_steps=8), "cpu") is None


# -- stored step times: only on the same, quiet machine -------------------------------------
STEP_METRICS = [{"id": "step_time.median.default", "name": "step time, median (default)", "value": 1.0}, {"id": "step_time.iqr.default", "name": "step time, IQR (default)", "value": 0.01}]


def _reason(baseline: dict, timings: perf_regression.Timings | None) -> str | None:
    return perf_regression.stored_timing_reason(as_report(baseline), timings, (0.01, 0.01))


def test_a_stored_step_time_compares_only_on_the_same_quiet_machine() -> None:
    assert _reason(baseline_with(STEP_METRICS), quiet_timings()) is None
    assert "older gate" in (_reason(baseline_with(STEP_METRICS, machine=None), quiet_timings()) or "")
    assert "another machine (CPU Test CPU @ 2.0GHz then, Other CPU now)" in (_reason(baseline_with(STEP_METRICS), quiet_timings(cpu_model="Other CPU")) or "")
    assert "cores 16 then, 2 now" in (_reason(baseline_with(STEP_METRICS), quiet_timings(cpus=2)) or "")
    assert "torch 2.13.0 then, 2.12.0 now" in (_reason(baseline_with(STEP_METRICS), quiet_timings(torch="2.12.0")) or "")
    busy = perf_regression.Timings(MachineRecord.model_validate(MACHINE), False, "other processes took up to 71% of its CPU time")
    assert _reason(baseline_with(STEP_METRICS), busy) == "this run's timing runs shared the machine (other processes took up to 71% of its CPU time)"
    loaded = baseline_with(STEP_METRICS)
    loaded["stages"][0]["details"]["runs"] = [{**QUIET_RUN, "load": {**QUIET_RUN["load"], "other_cpu_share": 0.6, "quiet": False}}]
    assert _reason(loaded, quiet_timings()) == "the baseline's timing runs shared the machine (other processes took 60% of its CPU time)"


def test_a_stored_step_time_under_another_openmp_wait_policy_is_not_comparable() -> None:
    # Spinning OpenMP threads make the same code slower on any machine that is not idle: a report
    # of an older gate (no policy recorded) or one run with another policy times another thing.
    passive = quiet_timings(omp_wait_policy="PASSIVE")
    assert "OpenMP wait policy None then, PASSIVE now" in (_reason(baseline_with(STEP_METRICS), passive) or "")
    assert _reason(baseline_with(STEP_METRICS, machine={**MACHINE, "omp_wait_policy": "PASSIVE"}), passive) is None
    assert "OpenMP wait policy ACTIVE then, PASSIVE now" in (_reason(baseline_with(STEP_METRICS, machine={**MACHINE, "omp_wait_policy": "ACTIVE"}), passive) or "")


def test_target_runs_wait_passively_for_their_openmp_threads_unless_the_user_chose() -> None:
    from traingate.pipeline.supervision.target_env import target_env

    assert target_env({"PATH": "/bin"}, "cpu")["OMP_WAIT_POLICY"] == "PASSIVE"
    assert target_env({"OMP_WAIT_POLICY": "active"}, "cuda")["OMP_WAIT_POLICY"] == "active"


def test_a_busy_run_against_a_quiet_report_is_not_comparable_and_never_a_finding(tmp_path: Path) -> None:
    """The issue's case: the same code, 97 times slower under load, its spread 98 % of its median."""
    from traingate.pipeline.model.schema import Metric
    from tests.stages.performance.measurements import make_ctx

    now = [Metric(id="step_time.median.default", name="step time, median (default)", value=97.0, unit="ms"), Metric(id="step_time.iqr.default", name="step time, IQR (default)", value=95.0, unit="ms"),
           Metric(id="memory.peak.live_tensors", name="peak live tensor memory (instrumented run)", value=1_300_000, unit="bytes")]
    base = baseline_with([*STEP_METRICS, {"id": "memory.peak.live_tensors", "name": "peak live tensor memory (instrumented run)", "value": 1_000_000}])
    busy = perf_regression.Timings(MachineRecord.model_validate(MACHINE), False, "other processes took up to 80% of its CPU time")
    summary, findings = perf_regression.compare(make_ctx(tmp_path, base), now, {"step_time.median.default": "step_time.iqr.default"}, "cpu", busy)
    # Peak memory, which load does not move, is still compared and still found.
    assert [f.evidence.data["metric_id"] for f in findings] == ["memory.peak.live_tensors"]
    [skipped] = summary.not_comparable
    assert skipped.metric_id == "step_time.median.default" and "shared the machine" in skipped.reason
    notice = timing_notice(True, summary)
    assert notice is not None and "step time, median (default) is not comparable" in notice and "neither block nor pass" in notice


def test_few_steps_against_a_stored_time_are_not_comparable_on_a_busy_machine(tmp_path: Path) -> None:
    from tests.stages.performance.measurements import make_ctx

    ctx = make_ctx(tmp_path, baseline_with(STEP_METRICS))
    busy = perf_regression.Timings(MachineRecord.model_validate(MACHINE), False, "other processes took up to 80% of its CPU time")
    row, finding = perf_regression.few_steps(ctx, "default", [0.1] * 5, "cpu", busy)
    assert finding is None and isinstance(row, NotComparable)
    row, finding = perf_regression.few_steps(ctx, "default", [0.1] * 5, "cpu", quiet_timings())
    assert finding is not None and finding.blocking


def test_no_notice_where_every_timing_was_compared() -> None:
    assert timing_notice(True, RegressionDetails(compared=[], note=None)) is None
    assert timing_notice(False, RegressionDetails(compared=[], note=None, not_comparable=[NotComparable(metric="m", metric_id="m", reason="r")])) is None


# -- the load readings -----------------------------------------------------------------------
def _proc(tmp_path: Path, busy: int, idle: int, loadavg: str = "3.50 2.00 1.00 5/300 42") -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    # user nice system idle iowait irq softirq steal
    (tmp_path / "stat").write_text(f"cpu  {busy} 0 0 {idle} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    (tmp_path / "loadavg").write_text(loadavg + "\n")
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Test CPU @ 2.0GHz\n")
    return tmp_path


def test_other_processes_cpu_share_leaves_out_the_runs_own(tmp_path: Path) -> None:
    before = perf_load.sample(_proc(tmp_path / "a", busy=1000, idle=1000))
    after_sample = perf_load.sample(_proc(tmp_path / "b", busy=1300, idle=1100))
    after = perf_load.CpuSample(before.at + 1.0, after_sample.busy_ticks, after_sample.total_ticks, after_sample.loadavg)
    # 300 busy ticks at 100 Hz = 3 s over 2 cores x 1 s; the run itself took 1 s of it.
    record = perf_load.load_between(before, after, own_cpu_s=1.0, cpus=2, tick_hz=100.0)
    assert record.other_cpu_share == pytest.approx(1.0) and not record.quiet and record.loadavg == 3.5
    quiet = perf_load.load_between(before, perf_load.CpuSample(before.at + 10.0, 1105, 2200, 0.1), own_cpu_s=1.0, cpus=2, tick_hz=100.0)
    assert quiet.other_cpu_share == pytest.approx(0.0025) and quiet.quiet
    machine = perf_load.machine("cpu", "2.13.0", None, _proc(tmp_path / "c", 1, 1), wait_policy="PASSIVE")
    assert machine.cpu_model == "Test CPU @ 2.0GHz" and machine.omp_wait_policy == "PASSIVE"


def test_an_unreadable_proc_is_never_quiet(tmp_path: Path) -> None:
    missing = perf_load.sample(tmp_path / "nothing")
    record = perf_load.load_between(missing, missing, own_cpu_s=1.0, cpus=2)
    assert record.other_cpu_share is None and not record.quiet


# -- the baseline's tree ---------------------------------------------------------------------
def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout.strip()


def test_the_baseline_tree_is_written_from_its_commit_with_its_own_entrypoint(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "pkg" / "pyproject.toml").write_text('[tool.traingate.entrypoint]\ncall = "train:train"\nkwargs = { steps = 7 }\n')
    (repo / "pkg" / "train.py").write_text("def train(steps):\n    return steps\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base")
    commit = _git(repo, "rev-parse", "HEAD")
    # This version edits its configuration and code; the baseline's are read from the commit.
    (repo / "pkg" / "pyproject.toml").write_text('[tool.traingate.entrypoint]\ncall = "train:train"\nkwargs = { steps = 1 }\n')
    (repo / "pkg" / "train.py").write_text("def train(steps):\n    return 0\n")
    code = baseline_code.checkout(repo / "pkg", commit, "pkg")
    assert isinstance(code, baseline_code.BaselineCode)
    try:
        assert code.root.name == "pkg" and not code.root.is_relative_to(repo)
        assert (code.root / "train.py").read_text() == "def train(steps):\n    return steps\n"
        assert code.entrypoint.kwargs == {"steps": 7}
    finally:
        code.remove()
    assert not code.root.exists()


@pytest.mark.parametrize(("commit", "reason"), [(None, "records no commit"), ("--output=/tmp/x", "not a commit id"), ("0" * 40, "is not in this clone")])
def test_no_baseline_tree_without_a_commit_of_this_clone(tmp_path: Path, commit: str | None, reason: str) -> None:
    _git(tmp_path, "init", "-q")
    found = baseline_code.checkout(tmp_path, commit, "t")
    assert isinstance(found, str) and reason in found


# -- the AMP speedup's floor on CUDA ---------------------------------------------------------
def test_an_amp_speedup_under_the_floor_within_its_noise_is_not_measured(tmp_path: Path) -> None:
    from tests.stages.performance.measurements import clock, make_ctx
    from tests.stages.performance.measurements import ACTIVE, noisy
    from traingate.stages.performance import amp as perf_amp

    ctx = make_ctx(tmp_path)
    policy = ctx.thresholds(PerformancePolicy)
    # Loud steps: the speedup's point estimate is under the floor, its interval reaches it.
    loud = perf_amp.compare(clock(noisy(10.0 * policy.amp_speedup_min * 0.95, 40, 0.8, 7)), clock(noisy(10.0, 40, 0.8, 8)), 3, 8, "cuda", active=True)
    assert loud.speedup is not None and loud.speedup < policy.amp_speedup_min and perf_amp.under_floor_within_noise(perf_amp._speedup_spread(loud), policy.amp_speedup_min)
    [speed] = [m for m in perf_amp.metrics(loud, policy, ACTIVE) if m.id == "amp.speedup"]
    assert speed.passed is None and (speed.note or "").startswith("not measured:")
    assert all(f.category.value != "amp-speedup" for f in perf_amp.target_findings(ctx, loud, policy, None))
    # Quiet steps, no speedup at all: the interval lies under the floor, and that blocks.
    flat = perf_amp.compare(clock(noisy(10.0, 40, 0.02, 7)), clock(noisy(10.0, 40, 0.02, 8)), 3, 8, "cuda", active=True)
    [speed] = [m for m in perf_amp.metrics(flat, policy, ACTIVE) if m.id == "amp.speedup"]
    assert speed.passed is False
    assert any(f.category.value == "amp-speedup" and f.blocking for f in perf_amp.target_findings(ctx, flat, policy, None))


def test_the_timing_plan_alternates_the_baseline_with_this_version_at_the_primary_setting(tmp_path: Path) -> None:
    from traingate.pipeline.model.config import EntrypointConfig
    from traingate.stages.performance.stage import _timing_plan

    code = baseline_code.BaselineCode("abc123", tmp_path, EntrypointConfig.model_validate({"call": "m:f", "amp_flag": "amp"}))
    plan = [(p.label, p.amp, p.baseline, p.extra) for p in _timing_plan("amp", 1, code)]
    # fp32 once, then A B A B with AMP on; the second B is the one extra run of this version.
    assert plan == [("fp32", False, False, False), ("amp", True, True, False), ("amp", True, False, False), ("amp", True, True, False), ("amp", True, False, True)]
    assert [(p.label, p.baseline) for p in _timing_plan(None, 1, "no commit")] == [("default", False)]
