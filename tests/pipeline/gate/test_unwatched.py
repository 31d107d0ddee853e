"""`unwatched-divergence` (`pipeline/gate/unwatched.py`): what the unwatched smoke call left
against what the watched runs left, at the seam (hand-made stage reports), then end to end on a
loop that trains only while it sees one of the gate's marks, each mark a variant, with its clean
control (`tests/targets/unwatched_hook`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import TARGETS, run_gate
from traingate.pipeline.gate.unwatched import first_difference, unwatched_findings
from traingate.pipeline.model.schema import RunLeft, Severity, StageReport, StageStatus
from traingate.pipeline.supervision.target_env import target_env
from traingate.stages.harness.left import left_models

BLOCK_ON = {Severity.CRITICAL, Severity.HIGH}
MODEL = [{"model": "Sequential", "parameters": 161, "digest": "1.0/2.0/3.0"}]


def _report(name: str, runs: list[RunLeft], verdict: str | None = None) -> StageReport:
    return StageReport(name=name, status=StageStatus.PASSED, score=100, duration_s=1.0, summary="", runs_left=runs, determinism=verdict)


def _run(stage: str, label: str, watched: bool, loss: float = 0.5, models: list[dict[str, Any]] = MODEL, amp: bool | None = None) -> RunLeft:
    return RunLeft(stage=stage, label=label, amp=amp, watched=watched, returned={"loss": loss, "epoch_time_s": 1.0 if watched else 9.0}, models=models)


def test_runs_that_left_the_same_agree_timings_aside() -> None:
    assert first_difference(_run("execution", "smoke", False), _run("correctness", "instrumented", True)) is None


def test_a_watched_run_that_left_other_parameters_blocks_where_the_training_is_deterministic() -> None:
    other = [{**MODEL[0], "digest": "1.5/2.0/3.0"}]
    reports = [
        _report("execution", [_run("execution", "smoke", False)]),
        _report("concurrency", [_run("concurrency", "instrumented", True, models=other)], verdict="identical: 12 optimizer step losses"),
    ]
    [finding] = unwatched_findings(reports, "configuration", "train:train", BLOCK_ON)
    assert finding.category.value == "unwatched-divergence" and finding.blocking and finding.severity is Severity.HIGH
    assert finding.evidence.data["fact"] == "model" and finding.evidence.data["watched"] == ["1.5/2.0/3.0"]
    assert finding.location is not None and (finding.location.path, finding.location.function) == ("train.py", "train")
    # The returned value is the fact where no model was left alive in both.
    reports[1] = _report("concurrency", [_run("concurrency", "instrumented", True, loss=0.9, models=[])], verdict="identical: 12 optimizer step losses")
    [finding] = unwatched_findings(reports, "configuration", "train:train", BLOCK_ON)
    assert finding.evidence.data["key"] == "loss" and (finding.evidence.data["unwatched"], finding.evidence.data["watched"]) == (0.5, 0.9)


def test_returned_values_the_same_seed_runs_disagreed_on_are_not_compared() -> None:
    """The concurrency stage's runs trained alike but returned another printed table (a timing
    column `...` hid from the timing filter): only the models are compared."""
    reports = [
        _report("execution", [_run("execution", "smoke", False)]),
        _report("concurrency", [_run("concurrency", "instrumented", True, loss=0.7)], verdict="identical training (24 step losses, parameters after 24 steps); returned values differ at `table`"),
    ]
    assert unwatched_findings(reports, "configuration", None, BLOCK_ON) == []
    reports[1] = _report("concurrency", [_run("concurrency", "instrumented", True, models=[{**MODEL[0], "digest": "9/9/9"}])], verdict="identical training (24 step losses); returned values differ at `table`")
    [finding] = unwatched_findings(reports, "configuration", None, BLOCK_ON)
    assert finding.blocking and finding.evidence.data["fact"] == "model"


@pytest.mark.parametrize("verdict", ["diverged at step 3", "diverged at the returned value `loss`"])
def test_without_deterministic_training_the_comparison_is_not_measured_never_passed(verdict: str) -> None:
    reports = [
        _report("execution", [_run("execution", "smoke", False)]),
        _report("concurrency", [_run("concurrency", "instrumented", True, loss=0.7)], verdict=verdict),
    ]
    [finding] = unwatched_findings(reports, "configuration", "train:train", BLOCK_ON)
    assert finding.severity is Severity.INFO and not finding.blocking and "not measured" in finding.title
    # Said whether or not the runs differ: never passed.
    reports[1] = _report("concurrency", [_run("concurrency", "instrumented", True)], verdict=verdict)
    [finding] = unwatched_findings(reports, "configuration", "train:train", BLOCK_ON)
    assert finding.severity is Severity.INFO


def test_without_a_same_seed_comparison_nothing_is_said_here() -> None:
    """The concurrency stage did not run: the report lists it as not run; no verdict here."""
    reports = [_report("execution", [_run("execution", "smoke", False)]), _report("correctness", [_run("correctness", "instrumented", True, loss=0.7)])]
    assert unwatched_findings(reports, "configuration", None, BLOCK_ON) == []


def test_only_runs_of_the_same_amp_setting_are_compared() -> None:
    reports = [
        _report("execution", [_run("execution", "smoke-amp-off", False, amp=False)]),
        _report("correctness", [_run("correctness", "instrumented", True, loss=0.7, amp=True)], verdict="identical: 8 optimizer step losses"),
    ]
    assert unwatched_findings(reports, "configuration", None, BLOCK_ON) == []


def test_what_a_call_leaves_is_read_exactly_and_changes_with_its_parameters() -> None:
    torch.manual_seed(0)
    kept = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    twin = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    twin.load_state_dict(kept.state_dict())
    left = [m for m in left_models(torch) if m["parameters"] == 21]
    assert len(left) == 2 and left[0]["digest"] == left[1]["digest"]
    with torch.no_grad():
        twin[0].weight[0, 0] += 1e-6
    left = [m for m in left_models(torch) if m["parameters"] == 21]
    assert left[0]["digest"] != left[1]["digest"]


def test_the_unwatched_run_starts_without_the_gates_own_settings() -> None:
    watched, unwatched = target_env({}, "cpu"), target_env({}, "cpu", unwatched=True)
    assert watched["OMP_WAIT_POLICY"] == "PASSIVE" and watched["PYTHONHASHSEED"] == "0"
    assert "OMP_WAIT_POLICY" not in unwatched and "PYTHONHASHSEED" not in unwatched
    assert target_env({"OMP_WAIT_POLICY": "ACTIVE"}, "cpu", unwatched=True)["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's own kept


def _variant(tmp_path: Path, mark: str) -> Path:
    target = tmp_path / mark
    shutil.copytree(TARGETS / "unwatched_hook", target)
    config = target / "pyproject.toml"
    config.write_text(config.read_text().replace('mark = "optimizer-hook"', f'mark = "{mark}"'))
    return target


@pytest.mark.slow
@pytest.mark.parametrize("mark", ["optimizer-hook", "module-hook", "patched-backward", "environ", "hash-seed"])
def test_a_loop_that_trains_only_while_it_sees_a_mark_blocks(tmp_path: Path, mark: str) -> None:
    run = run_gate(_variant(tmp_path, mark), tmp_path / "out", "--stages", "execution,concurrency,correctness")
    [finding] = [f for s in run.report["stages"] for f in s["findings"] if f["category"] == "unwatched-divergence"]
    assert finding["blocking"] and run.report["decision"] == "BLOCK"
    assert finding["evidence"]["data"]["key"] == "loss" and finding["location"]["path"] == "train.py"


@pytest.mark.slow
def test_the_same_loop_reading_nothing_passes(tmp_path: Path) -> None:
    run = run_gate(_variant(tmp_path, "none"), tmp_path / "out", "--stages", "execution,concurrency,correctness")
    assert run.report["decision"] == "PASS", [f["title"] for s in run.report["stages"] for f in s["findings"] if f["blocking"]]
    assert not [f for s in run.report["stages"] for f in s["findings"] if f["category"] == "unwatched-divergence"]
