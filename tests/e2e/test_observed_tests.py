"""With no entrypoint configured, the training inside the tests is observed (docs/stages.md).

Each `observe_*` fixture repo configures no entrypoint; its tests train (a plain loop, a
hand-written Trainer's `fit`, a Lightning-style module fitted by a small trainer). Each is also
run here with a hand-written entrypoint that makes the same call as its test: the two runs must
reach the same decision, with the same findings (category, path, line) in the stages that
observe training, and each finding of the observed run names the test. The clean control
passes both ways; a test that trains fewer steps than a verdict needs is "not measured"; and
against a baseline, the test the baseline observed is observed again in its baseline form when
the change edits it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, line_of, run_gate
from tests.observed_vs_configured import Case, assert_found_at_markers, assert_same_verdict, observed_findings, observed_or_configured

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]

# case: (stages, the hand-written entrypoint making the test's call, the observed test,
#        expected findings as (category, file, marker))
CASES: dict[str, Case] = {
    "observe_loop_stale": (
        "execution,correctness",
        'call = "loop:train"\nkwargs = { steps = 8, batch_size = 8 }',
        "tests/test_loop.py::test_train_runs_eight_steps",
        [("stale-gradients", "loop.py", "marker: step")],
    ),
    "observe_trainer_eval": (
        "execution,correctness",
        'call = "pkg.trainer:Trainer.fit"\nsetup = "traingate_setup:trainer"\nkwargs = { epochs = 3 }',
        "tests/test_trainer.py::test_fit_three_epochs",
        [("train-eval-mode", "pkg/trainer.py", "marker: eval")],
    ),
    "observe_module_softmax": (
        "execution,correctness",
        'call = "lit.trainer:MiniTrainer.fit"\nsetup = "traingate_setup:fit_objects"',
        "tests/test_fit.py::test_fit_runs",
        [("loss-input-mismatch", "lit/module.py", "marker: loss")],
    ),
    "observe_frozen_head": (
        "execution,correctness",
        'call = "finetune:finetune"\nkwargs = { steps = 8 }',
        "tests/test_finetune.py::test_finetune_a_few_steps",
        [("unused-parameter", "finetune.py", "marker: freeze")],
    ),
    "observe_leak": (
        "execution,performance",
        'call = "train:train"\nkwargs = { steps = 40 }',
        "tests/test_train.py::test_one_epoch_of_forty_steps",
        [("memory-leak", "train.py", "marker: leak-running-total")],
    ),
    "observe_clean": (
        "execution,performance,concurrency,correctness",
        'call = "trainer:Trainer.fit"\nsetup = "traingate_setup:trainer"\nkwargs = { epochs = 1 }',
        "tests/test_trainer.py::test_fit_one_epoch",
        [],
    ),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, shared_gate: Callable[..., tuple[GateRun, float]]) -> Callable[[str, bool], GateRun]:
    return observed_or_configured(CASES, shared_gate, tmp_path_factory)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_tests_training_gets_the_verdict_of_a_hand_written_entrypoint(runs: Callable[[str, bool], GateRun], case: str) -> None:
    assert_same_verdict(runs(case, False), runs(case, True), CASES[case][0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_findings_are_at_the_users_lines_and_name_the_test(runs: Callable[[str, bool], GateRun], case: str) -> None:
    _, _, test, expected = CASES[case]
    run = runs(case, False)
    assert_found_at_markers(run, case, test, expected)
    assert "most optimizer steps" in run.report["observed_training"]["reason"]
    assert f"`{test}`" in (run.out / "report.md").read_text()


def test_what_a_tests_training_cannot_run_is_not_measured_never_passed(runs: Callable[[str, bool], GateRun]) -> None:
    run = runs("observe_clean", False)
    test = CASES["observe_clean"][2]
    amp = [line for line in run.stage("performance")["details"]["not_measured"] if line.startswith("Mixed precision on vs off")]
    assert amp == [amp[0]] and f"not measured: the training observed is a test ({test})" in amp[0] and "configured entrypoint" in amp[0]
    checks = run.stage("correctness")["details"]["checks"]
    for name in ("grad_accumulation", "distributed"):
        assert checks[name]["ran"] is False
        assert checks[name]["note"].startswith(f"not measured: the training observed is a test ({test})") and "configured entrypoint" in checks[name]["note"]
    assert "Not measured on a test's training" in (run.out / "report.md").read_text()
    # With the entrypoint configured, the same checks say what to configure instead.
    configured = runs("observe_clean", True).stage("correctness")["details"]["checks"]
    assert configured["grad_accumulation"]["note"].startswith("not configured")


def test_the_eval_call_left_on_is_found_inside_the_trainer_the_test_fits(runs: Callable[[str, bool], GateRun]) -> None:
    [left] = [f for f in observed_findings(runs("observe_trainer_eval", False)) if f["category"] == "train-eval-mode"]
    site = left["evidence"]["data"]["eval_site"]
    assert (site["path"], site["line"]) == ("pkg/trainer.py", line_of(TARGETS / "observe_trainer_eval" / "pkg" / "trainer.py", "marker: eval"))


def test_the_test_that_made_the_most_steps_is_observed_and_the_others_listed(runs: Callable[[str, bool], GateRun]) -> None:
    observed = runs("observe_leak", False).report["observed_training"]
    assert [(c["nodeid"], c["optimizer_steps"]) for c in observed["candidates"]] == [
        ("tests/test_train.py::test_one_epoch_of_forty_steps", 40),
        ("tests/test_train.py::test_two_steps", 2),
    ]
    tests = {t["nodeid"]: t["optimizer_steps"] for t in runs("observe_loop_stale", False).stage("execution")["tests"]}
    assert tests == {"tests/test_loop.py::test_model_output_shape": 0, "tests/test_loop.py::test_train_runs_eight_steps": 8}


def test_an_entrypoint_configured_changes_nothing(runs: Callable[[str, bool], GateRun]) -> None:
    run = runs("observe_loop_stale", True)
    assert run.report["observed_training"] is None
    assert all("training_test" not in f["evidence"]["data"] for f in observed_findings(run))
    assert {t["optimizer_steps"] for t in run.stage("execution")["tests"]} == {0, 8}


def test_training_in_a_fixture_of_a_parametrised_test_class_is_observed(gate: Callable[..., GateRun]) -> None:
    run = gate("observe_fixture_param", "--stages", "execution,correctness")
    test = "tests/test_model.py::TestTrained::test_predicts_a_finite_value[0.001]"
    assert run.report["observed_training"]["test"] == test
    assert [c["optimizer_steps"] for c in run.report["observed_training"]["candidates"]] == [6, 4]
    [finding] = run.findings("stale-gradients")
    assert (finding["location"]["path"], finding["location"]["line"]) == ("model.py", line_of(TARGETS / "observe_fixture_param" / "model.py", "marker: step"))
    assert finding["evidence"]["data"]["training_test"] == test and run.report["decision"] == "BLOCK"


def test_too_few_steps_for_a_verdict_is_not_measured(gate: Callable[..., GateRun]) -> None:
    run = gate("observe_few_steps", "--stages", "execution,correctness")
    correctness = run.stage("correctness")
    assert correctness["status"] == "skipped" and correctness["score"] is None
    assert correctness["skipped_reason"].startswith("not measured: the test that trained most, tests/test_loop.py::test_one_step, made 1 optimizer step(s)")
    assert run.report["observed_training"]["test"] is None
    assert any(n["name"] == "correctness" and "not measured" in n["reason"] for n in run.report["stages_not_run"])


# -- against a baseline: the baseline's training test is observed again -------------------------

CLEARED = "        x, y = next(batches)\n        optimizer.zero_grad()\n"
NOT_CLEARED = "        x, y = next(batches)\n"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def baseline_case(tmp_path_factory: pytest.TempPathFactory) -> tuple[GateRun, GateRun, GateRun]:
    """A clean loop whose test trains 8 steps (the baseline), then a change that stops clearing
    the gradients and edits the test to train one step: run without and with the baseline."""
    base = tmp_path_factory.mktemp("observe-baseline")
    repo = base / "repo"
    shutil.copytree(TARGETS / "observe_loop_stale", repo)
    loop = repo / "loop.py"
    loop.write_text(loop.read_text().replace(NOT_CLEARED, CLEARED))
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "base")
    before = run_gate(repo, base / "out-base", "--stages", "execution,correctness")
    loop.write_text(loop.read_text().replace(CLEARED, NOT_CLEARED))
    test = repo / "tests" / "test_loop.py"
    test.write_text(test.read_text().replace("train(steps=8, batch_size=8)", "train(steps=1, batch_size=8)"))
    _git(repo, "commit", "-qam", "change")
    alone = run_gate(repo, base / "out-alone", "--stages", "execution,correctness")
    against = run_gate(repo, base / "out-against", "--stages", "execution,correctness", "--baseline", str(base / "out-base" / "report.json"))
    return before, alone, against


def test_the_baselines_training_test_is_observed_again_in_its_baseline_form(baseline_case: tuple[GateRun, GateRun, GateRun]) -> None:
    before, alone, against = baseline_case
    test = "tests/test_loop.py::test_train_runs_eight_steps"
    assert before.report["decision"] == "PASS" and before.report["observed_training"]["test"] == test
    # The change alone: its edited test trains one step, too few for a verdict.
    assert alone.stage("correctness")["status"] == "skipped" and alone.report["observed_training"]["test"] is None
    # Against the baseline: the baseline's form of the test (8 steps) runs on the change's code.
    observed = against.report["observed_training"]
    assert observed["test"] == test and observed["baseline_form"] is True
    assert "tests/test_loop.py" in observed["reason"]
    [finding] = against.findings("stale-gradients")
    assert (finding["location"]["path"], finding["location"]["line"]) == ("loop.py", line_of(TARGETS / "observe_loop_stale" / "loop.py", "marker: step"))
    assert finding["evidence"]["data"]["training_test"] == test and finding["evidence"]["data"]["baseline_form"] is True
    assert against.report["decision"] == "BLOCK"
