"""The smoke call runs the configuration the user gave, and a crash of the target's code is
an `entrypoint-crash` at its line in every stage (never a `stage-error`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TARGETS, line_of, run_gate

pytestmark = pytest.mark.slow

AMP_CRASH = "perf_amp_path_crash"


def _step_line() -> int:
    return line_of(TARGETS / AMP_CRASH / "train.py", "scaler.step(optimizer)")


def test_configured_amp_setting_is_called_first_and_its_crash_blocks(tmp_path: Path) -> None:
    run = run_gate(TARGETS / AMP_CRASH, tmp_path / "out", "--stages", "execution", timeout=300)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK", run.stdout + run.stderr
    [crash] = run.findings("entrypoint-crash")
    assert crash["blocking"] and crash["severity"] == "critical"
    assert (crash["location"]["path"], crash["location"]["line"]) == ("train.py", _step_line())
    assert "use_amp=True" in crash["title"]
    assert "step() has already been called" in crash["evidence"]["summary"]
    smoke = run.stage("execution")["details"]["smoke"]
    # kwargs set use_amp = true: that call first, then the other setting, which trains.
    assert [(r["label"], r["amp"], r["ok"]) for r in smoke["runs"]] == [("amp-on", True, False), ("amp-off", False, True)]
    assert any("use_amp=True first" in note for note in smoke["notes"])
    assert not run.findings("stage-error")


def test_performance_stage_reports_the_amp_path_crash_at_its_line(tmp_path: Path) -> None:
    run = run_gate(TARGETS / AMP_CRASH, tmp_path / "out", "--stages", "performance", timeout=300)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK", run.stdout + run.stderr
    assert not run.findings("stage-error"), run.findings("stage-error")
    [crash] = run.findings("entrypoint-crash", stage="performance")
    assert (crash["location"]["path"], crash["location"]["line"]) == ("train.py", _step_line())
    assert "performance stage" in crash["title"] and crash["blocking"]


@pytest.mark.parametrize("stage", ["performance", "concurrency"])
def test_a_crash_of_the_target_in_any_stage_is_an_entrypoint_crash(tmp_path: Path, stage: str) -> None:
    target = TARGETS / "exec_defects"
    run = run_gate(target, tmp_path / "out", "--stages", stage, timeout=300)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK", run.stdout + run.stderr
    assert not run.findings("stage-error"), run.findings("stage-error")
    [crash] = run.findings("entrypoint-crash", stage=stage)
    line = line_of(target / "train_loop.py", 'env["train_data"]')
    assert (crash["location"]["path"], crash["location"]["line"]) == ("train_loop.py", line)
    assert f"{stage} stage" in crash["title"] and "KeyError" in crash["title"]
