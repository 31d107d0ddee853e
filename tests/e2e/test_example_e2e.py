"""The bundled example end to end: v7 blocks on the KeyError the reviewers had to guess at."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, line_of, run_gate

EXAMPLE = REPO / "examples" / "amp-trainer"
TRAINER = "utils/tier3_training_utilities.py"


def _line(root: Path, path: str, text: str) -> int:
    return line_of(root / path, text)


@pytest.mark.slow
def test_v7_blocks_on_the_entrypoint_crash_at_its_line(tmp_path: Path) -> None:
    run = run_gate(EXAMPLE, tmp_path / "out", "--task", "T035", "--version", "v7")
    assert run.returncode == 1, run.stdout + run.stderr
    report = run.report
    assert (report["task"], report["version"], report["decision"]) == ("T035", "v7", "BLOCK")
    [crash] = run.findings("entrypoint-crash")
    assert crash["severity"] == "critical" and crash["blocking"]
    assert crash["location"]["path"] == TRAINER
    assert crash["location"]["line"] == _line(EXAMPLE, TRAINER, "len(env['train_data'])")
    assert crash["location"]["function"] == "test_fine_tuning"
    assert "KeyError" in crash["evidence"]["traceback"]
    [untested] = run.findings("entrypoint-untested")
    assert untested["location"]["path"] == TRAINER
    # The suite itself is green: the crash is only found by running the entrypoint.
    assert not run.findings("test-failure")
    # Profiling a function that crashes on its first lines measures nothing: said, not passed.
    for name in ("performance", "concurrency"):
        assert run.stage(name)["status"] == "skipped"
        assert "crashed" in run.stage(name)["skipped_reason"]
    for name in ("report.md", "execution.md", "performance.md", "concurrency.md"):
        assert (run.out / name).is_file()
    assert "KeyError" in (run.out / "report.md").read_text()


@pytest.mark.slow
def test_fixed_v7_passes_the_execution_stage(tmp_path: Path) -> None:
    fixed = tmp_path / "v7-fixed"
    subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), "v7-fixed", str(fixed)], check=True, capture_output=True)
    run = run_gate(fixed, tmp_path / "out", "--stages", "execution", "--version", "v7-fixed")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.report["decision"] == "PASS"
    assert not run.findings("entrypoint-crash") and not run.findings("entrypoint-untested")
    assert [f for f in run.findings() if f["blocking"]] == []
    # Its three CUDA skips are real: with a baseline that had them, the decision stays PASS.
    [skips] = run.findings("skipped-tests")
    assert skips["severity"] == "low" and len(skips["evidence"]["data"]["tests"]) == 3
    again = run_gate(fixed, tmp_path / "again", "--stages", "execution", "--version", "v7-fixed-again", "--baseline", str(run.out / "report.json"))
    assert again.returncode == 0 and again.report["decision"] == "PASS", again.stdout
    assert not again.findings("test-disabled") and not again.findings("test-selection") and not again.findings("test-weakened")
    assert [f["title"] for f in again.findings("skipped-tests")] == [skips["title"]]


@pytest.mark.slow
def test_a_hanging_entrypoint_is_reported_once_within_the_budget(tmp_path: Path) -> None:
    target = REPO / "tests" / "targets" / "pipeline_entrypoint_hang"
    run = run_gate(target, tmp_path / "out")
    assert run.returncode == 1
    [hang] = run.findings("hang")
    assert hang["stage"] == "execution" and hang["blocking"]
    assert hang["location"] == {"path": "train.py", "line": _line(target, "train.py", "marker: waits forever"), "function": "main"}
    assert "most recent call first" in hang["evidence"]["traceback"]
    # The later stages would only hang again: they say why they did not run.
    for name in ("performance", "concurrency"):
        assert run.stage(name)["status"] == "skipped"
    # Within the stage's budget: the target's time. The wait for the gate's own imports (the
    # agents' host, slow on a busy machine) comes before the budget starts, outside it.
    assert run.stage("execution")["duration_s"] <= 10 + 2
