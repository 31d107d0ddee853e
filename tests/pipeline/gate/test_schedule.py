"""Which stages run side by side (`pipeline/gate/schedule.py`), and that a group's reports are
the ones the stages in order would write (`orchestrator._run_group`)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from traingate.pipeline.gate import orchestrator
from traingate.pipeline.gate.orchestrator import AgentRun, RunRequest, Settling, _run_group
from traingate.pipeline.gate.schedule import side_by_side, stage_groups, timed_first, usable_cores
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.findings import SMOKE_CALL_RUN, hang_finding
from traingate.pipeline.model.registry import build_registry
from traingate.pipeline.model.schema import Severity, StageOutcome, StageStatus, TrainingStopped
from traingate.pipeline.supervision.isolation import ChildResult

BUILT_IN = ["execution", "performance", "concurrency", "correctness"]


def test_as_many_stages_side_by_side_as_the_cores_hold_their_runs_threads() -> None:
    assert side_by_side(2, {"OMP_NUM_THREADS": "1"}) == 2
    assert side_by_side(4, {"OMP_NUM_THREADS": "2"}) == 2
    assert side_by_side(4, {"OMP_NUM_THREADS": "1,1"}) == 4  # a nested setting: its first level
    # torch's default is one thread per core: two runs at once would share every core.
    assert side_by_side(4, {}) == side_by_side(4, {"OMP_NUM_THREADS": "0"}) == side_by_side(4, {"OMP_NUM_THREADS": "many"}) == 1
    assert side_by_side(1, {"OMP_NUM_THREADS": "1"}) == 1
    assert side_by_side(2, {"OMP_NUM_THREADS": "4"}) == 1


def test_one_core_runs_every_stage_alone_in_order() -> None:
    assert stage_groups(BUILT_IN, build_registry(), width=1) == [[name] for name in BUILT_IN]


def test_the_first_stage_runs_alone_and_the_timed_one_leads_the_group_after_it() -> None:
    registry = build_registry()
    # execution finds out whether the training function runs (purpose None); performance times its runs.
    assert stage_groups(BUILT_IN, registry, width=2) == [["execution"], ["performance", "concurrency", "correctness"]]
    assert stage_groups(BUILT_IN, registry, width=4) == [["execution"], ["performance", "concurrency", "correctness"]]
    assert stage_groups(["concurrency", "correctness"], registry, width=2) == [["concurrency", "correctness"]]
    assert stage_groups(["performance", "correctness"], registry, width=4) == [["performance", "correctness"]]
    assert timed_first(["performance", "correctness"], registry) and not timed_first(["concurrency", "correctness"], registry)
    # A timed stage after others waits for them: it starts a group of its own.
    timed, untimed = SimpleNamespace(needs_training=True, times_runs=True), SimpleNamespace(needs_training=True, times_runs=False)
    mixed = {"a": untimed, "t": timed, "b": untimed, "u": timed}
    assert stage_groups(["a", "t", "b", "u"], mixed, width=2) == [["a"], ["t", "b"], ["u"]]  # type: ignore[arg-type]


def test_a_group_holds_every_stage_that_may_go_side_by_side() -> None:
    untimed = SimpleNamespace(needs_training=True, times_runs=False)
    registry = {name: untimed for name in "abcde"}
    assert stage_groups(list("abcde"), registry, width=2) == [list("abcde")]  # type: ignore[arg-type]


class _Timeline:
    """Fake agents' runs that record when each started and ended."""

    def __init__(self, seconds: dict[str, float], release_after: float | None = None) -> None:
        self.seconds, self.release_after = seconds, release_after
        self.events: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.running = 0
        self.most = 0

    def note(self, name: str, what: str) -> None:
        with self.lock:
            self.events.append((name, what))

    def run(self, name: str, released: threading.Event | None) -> AgentRun:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        self.note(name, "start")
        if released is not None and self.release_after is not None:
            time.sleep(self.release_after)
            self.note(name, "release")
            released.set()
        time.sleep(self.seconds[name])
        with self.lock:
            self.running -= 1
        self.note(name, "end")
        return AgentRun(name=name, config=TargetConfig(), root=Path(name), outcome=StageOutcome(summary=name), duration_s=self.seconds[name])

    def index(self, name: str, what: str) -> int:
        return self.events.index((name, what))


def test_no_more_stages_at_once_than_the_width_the_next_starting_as_one_ends() -> None:
    timeline = _Timeline({"a": 0.3, "b": 0.05, "c": 0.05, "d": 0.05})
    runs = orchestrator._run_agents(list("abcd"), timeline.run, width=2)
    assert list(runs) == list("abcd") and timeline.most == 2
    starts = [name for name, what in timeline.events if what == "start"]
    assert starts == list("abcd")
    # c and d ran in b's slot while a, the long one, still ran: no group waited for its slowest.
    assert timeline.index("d", "end") < timeline.index("a", "end")


def test_the_others_start_when_the_timed_stage_releases_the_machine_and_run_beside_its_rest() -> None:
    timeline = _Timeline({"perf": 0.4, "conc": 0.1, "corr": 0.1}, release_after=0.2)
    runs = orchestrator._run_agents(["perf", "conc", "corr"], timeline.run, width=2, timed=True)
    assert list(runs) == ["perf", "conc", "corr"]
    release = timeline.index("perf", "release")
    assert timeline.index("conc", "start") > release and timeline.index("corr", "start") > release
    assert timeline.index("conc", "start") < timeline.index("perf", "end")  # beside the untimed rest
    assert timeline.most == 2


def test_a_timed_stage_that_never_releases_the_machine_holds_it_to_its_end() -> None:
    """One that ended early (a crash in its first timed run) or that no agent's notice released."""
    timeline = _Timeline({"perf": 0.2, "conc": 0.05})
    orchestrator._run_agents(["perf", "conc"], timeline.run, width=2, timed=True)
    assert timeline.index("conc", "start") > timeline.index("perf", "end")


def test_usable_cores_is_the_affinity_mask() -> None:
    assert usable_cores() == len(__import__("os").sched_getaffinity(0))


class _Snapshot:
    def __init__(self) -> None:
        self.discarded: list[Path] = []

    def discard(self, copy: Path) -> None:
        self.discarded.append(copy)


def test_a_group_runs_side_by_side_and_reports_in_order_as_if_run_one_after_another(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """concurrency and correctness start together; concurrency's smoke hang stops the training
    function, so correctness, which ran beside it, is reported skipped and its copy discarded."""
    config = TargetConfig()
    child = ChildResult(argv=["python"], returncode=-9, timed_out=True, duration_s=1.0, stdout="", stderr="")
    ctx = SimpleNamespace(stage="concurrency", root=tmp_path, block_on={Severity.CRITICAL, Severity.HIGH})
    hang = hang_finding(ctx, child, "The smoke call", run=SMOKE_CALL_RUN)
    both_running = threading.Barrier(2, timeout=30)  # fails unless the two agents run at once

    def fake_agent(name: str, stage: object, request: RunRequest, cfg: TargetConfig, snapshot: object, agents: object, baseline_entrypoint: object, released: object = None) -> AgentRun:
        both_running.wait()
        if name == "correctness":
            time.sleep(0.05)  # finishes last: the reports still come in the stages' order
        stopped = [TrainingStopped(finding=hang.id, reason="hang")] if name == "concurrency" else []
        outcome = StageOutcome(summary=f"{name} ran", findings=[hang] if name == "concurrency" else [], training_stopped=stopped)
        return AgentRun(name=name, config=cfg, root=tmp_path / name, outcome=outcome, duration_s=1.0)

    monkeypatch.setattr(orchestrator, "run_stage_agent", fake_agent)
    monkeypatch.setattr(orchestrator, "written_findings", lambda *a, **k: [])
    finished: list[str] = []
    observer = SimpleNamespace(stage_started=lambda name, index, total: None, stage_finished=lambda report: finished.append(report.name))
    request = RunRequest(root=tmp_path, task="T", version="v", stages=["concurrency", "correctness"], out=tmp_path / "out", device="cpu", observers=[observer])  # type: ignore[list-item]
    snapshot = _Snapshot()
    reports: list = []
    _run_group(["concurrency", "correctness"], build_registry(), request, config, snapshot, reports, Settling(), None)  # type: ignore[arg-type]
    assert [r.name for r in reports] == finished == ["concurrency", "correctness"]
    assert reports[0].status is StageStatus.BLOCKED and reports[0].summary == "concurrency ran"
    assert reports[1].status is StageStatus.SKIPPED and "did not finish in the concurrency stage" in (reports[1].skipped_reason or "")
    assert snapshot.discarded == [tmp_path / "concurrency", tmp_path / "correctness"]


def test_a_real_run_starts_the_observing_stages_after_the_timed_runs_and_beside_the_instrumented_one(gate) -> None:
    """What the work folder's files show of a real gate run with two stages at once (this
    suite sets OMP_NUM_THREADS=1): every file of the performance stage's timing runs was
    written before the concurrency stage's agent was sent its request, and the performance
    stage's instrumented run ended after that: the agent's notice started the others."""
    if side_by_side(usable_cores(), os.environ) < 2:
        pytest.skip("one stage at a time on this machine")
    run = gate("entry_script")
    assert (run.returncode, run.report["decision"]) == (0, "PASS"), run.stdout
    work = run.out / "work"
    timing = [p.stat().st_mtime_ns for p in (work / "performance").glob("performance-*-timing-*")]
    profile = [p.stat().st_mtime_ns for p in (work / "performance").glob("performance-*-profile.*")]
    started = {stage: (work / stage / "agent-request.json").stat().st_mtime_ns for stage in ("concurrency", "correctness")}
    assert timing and profile
    assert max(timing) <= started["concurrency"] < max(profile)
    assert max(timing) <= started["correctness"]
    labels = [r["label"] for r in run.stage("performance")["details"]["runs"]]
    assert labels == ["timing (fp32)", "timing (amp)", "profile (instrumented)"]
