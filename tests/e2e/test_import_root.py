"""Targets with their own top-level `pipeline`, `stages`, `reports` or `tests` packages (common
names in ML repos) run through the installed console script exactly like any other target.

traingate installs under the one import root `traingate`, and its children start without the
target root on sys.path, so neither side can shadow the other: the gate never imports the
target's `pipeline.config`, and the target's own `stages.prep`, `reports` and `tests.conftest`
import normally in the smoke call and under pytest.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TARGETS
from tests.paths import REPO

pytestmark = pytest.mark.slow

MARKER_ENV = "CLASH_MARKER_DIR"  # where the clash fixtures' packages record that they were imported


@pytest.fixture
def marker_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder, named in the environment every gate process inherits, that the fixture's
    `pipeline` package writes a file into whenever some process imports it."""
    folder = tmp_path / "imported"
    folder.mkdir()
    monkeypatch.setenv(MARKER_ENV, str(folder))
    return folder


def test_the_clash_pipeline_marker_records_an_import(marker_dir: Path) -> None:
    """Control: importing the fixture's `pipeline.config` does leave a marker and raise, so an
    empty marker folder after a gate run means nobody imported it."""
    done = subprocess.run(
        [sys.executable, "-c", "import pipeline.config"],
        cwd=TARGETS / "clash_pipeline", capture_output=True, text=True, timeout=60,
    )
    assert done.returncode != 0 and "the target's pipeline/config.py was imported" in done.stderr
    assert sorted(p.name.rsplit(".", 1)[0] for p in marker_dir.iterdir()) == ["pipeline.__init__", "pipeline.config"]


def test_a_target_pipeline_package_is_never_imported_by_the_gate(gate, marker_dir: Path) -> None:
    run = gate("clash_pipeline", "--stages", "execution", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.report["decision"] == "PASS"
    execution = run.stage("execution")
    assert execution["status"] == "passed" and execution["findings"] == [], execution
    assert "2 passed, 0 failed" in execution["summary"] and "smoke call ok" in execution["summary"]
    # The target's own code never imports its `pipeline`, so only a gate process could have.
    assert list(marker_dir.iterdir()) == []


def test_a_target_reports_module_and_tests_package_run_normally(gate) -> None:
    run = gate("clash_reports", "--stages", "execution", timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    execution = run.stage("execution")
    assert execution["status"] == "passed" and execution["findings"] == [], execution
    # Both tests ran: one uses the target's conftest fixture, one checks which modules were imported.
    assert "2 passed, 0 failed, 0 errors, 0 skipped of 2 collected" in execution["summary"]


def test_target_code_importing_its_own_stages_package_runs_in_every_stage(gate) -> None:
    run = gate("clash_stages", timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.report["decision"] == "PASS"
    assert [s["name"] for s in run.report["stages"]] == ["execution", "performance", "concurrency", "correctness"]
    for stage in run.report["stages"]:
        assert stage["status"] == "passed", (stage["name"], stage["summary"], stage["findings"])
    assert "stage-error" not in run.categories()
    execution = run.stage("execution")
    assert "3 passed, 0 failed" in execution["summary"] and "smoke call ok" in execution["summary"]
    # The stages observed every one of the target's training steps (kwargs steps = 20).
    assert metric(run.stage("performance"), "steps.profiled") == 20
    assert metric(run.stage("concurrency"), "steps.observed") == 20


def metric(stage: dict, metric_id: str) -> object:
    [value] = [m["value"] for m in stage["metrics"] if m.get("id") == metric_id]
    return value


def test_child_side_code_never_needs_numpy() -> None:
    # The harness and the probes run inside the target's process, whose environment need not
    # have numpy: torch then raises "Numpy is not available" from Tensor.numpy(), inside the
    # target's own call, and the gate would report the target as crashing.
    import ast

    repo = REPO
    child_side = [*sorted((repo / "stages" / "harness").glob("*.py")), *sorted(repo.glob("stages/*/probe/*.py"))]
    assert len(child_side) > 10
    calls = []
    for path in child_side:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "numpy" and not node.args:
                calls.append(f"{path.relative_to(repo)}:{node.lineno}")
    assert calls == []
