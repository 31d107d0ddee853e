"""The execution stage's smoke calls side by side where the cores hold them (`calls_at_once`),
one after the other where they do not; a call that hangs is reported once either way."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import TARGETS, line_of, run_gate
from traingate.stages.execution.smoke import calls_at_once

HANG_AMP = TARGETS / "exec_smoke_hang_amp"


@pytest.mark.parametrize(
    ("cores", "omp", "beside", "expected"),
    [
        (2, "1", 0, 2),  # two single-threaded calls on two cores
        (2, "1", 1, 1),  # the suite beside them takes one core
        (4, "1", 1, 3),
        (2, None, 0, 1),  # torch's default: a thread per core, so one call fills the machine
        (4, "2,1", 0, 2),  # the first level of a nested setting
        (1, "1", 0, 1),
    ],
)
def test_calls_at_once_counts_the_cores_each_call_needs(monkeypatch: pytest.MonkeyPatch, cores: int, omp: str | None, beside: int, expected: int) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: set(range(cores)))
    env = {"OMP_NUM_THREADS": omp} if omp is not None else {}
    assert calls_at_once(env, beside) == expected


def test_calls_at_once_counts_the_machines_cores_where_the_platform_has_no_affinity_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_getaffinity")
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert calls_at_once({"OMP_NUM_THREADS": "1"}, 1) == 3


@pytest.mark.slow
def test_a_hanging_smoke_call_is_one_hang_and_the_other_setting_still_runs_beside_it(tmp_path: Path) -> None:
    run = run_gate(HANG_AMP, tmp_path / "out", "--stages", "execution", timeout=300)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK", run.stdout + run.stderr
    [hang] = run.findings("hang")
    assert hang["blocking"] and "use_amp=False" in hang["title"]
    assert (hang["location"]["path"], hang["location"]["line"]) == ("train.py", line_of(HANG_AMP / "train.py", "planted: nothing ever sets it"))
    assert not run.findings("entrypoint-crash") and not run.findings("stage-error")
    smoke_details = run.stage("execution")["details"]["smoke"]
    runs = [(r["label"], r["amp"], r["ok"]) for r in smoke_details["runs"]]
    if calls_at_once({k: v for k, v in os.environ.items() if k == "OMP_NUM_THREADS"}, 0) >= 2:
        # Side by side: the AMP-on call trained while the AMP-off one waited.
        assert runs == [("amp-off", False, False), ("amp-on", True, True)]
        assert "trained 3 steps" in smoke_details["runs"][1]["stdout_head"]
    else:
        # One after the other: the hang spent the budget, the next call was not made.
        assert runs == [("amp-off", False, False)]
        assert any("amp-on smoke call was not run" in note for note in smoke_details["notes"])
