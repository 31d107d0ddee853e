"""stale-gradients and train-eval-mode end to end: one `traingate run --stages correctness` per
fixture target, shared by the assertions on its report; expected lines come from `# marker:`
comments.
The decision and each finding's category, severity and line are rows of
tests/e2e/test_fixture_targets.py, which reads the same run; the evidence is checked here."""

from __future__ import annotations


import pytest

from tests.correctness_runs import CORRECTNESS, Shared
from tests.correctness_runs import located as _located
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


def test_gradients_never_cleared_block_at_the_step_naming_the_backward(shared_gate: Shared) -> None:
    stale = shared_gate("corr_stale_grads", *CORRECTNESS)[0]
    [finding] = stale.findings()
    data = finding["evidence"]["data"]
    assert _site(data["backward_site"]) == _marker("corr_stale_grads", "backward")
    # 8 steps: every one after the first applies what the earlier ones left.
    assert data["steps_affected"] == [1, 2, 3, 4, 5, 6, 7] and data["steps_judged"] == 7
    assert all(s["carried_share"] > 0 and s["params_carrying"] == s["params"] == 4 for s in data["per_step"])


def test_the_stale_check_and_the_mode_check_say_what_they_judged(shared_gate: Shared) -> None:
    stale = shared_gate("corr_stale_grads", *CORRECTNESS)[0]
    checks = stale.stage("correctness")["details"]["checks"]
    assert checks["stale_gradients"]["ran"] is True and checks["stale_gradients"]["steps_stale"] == 7
    # No Dropout or BatchNorm in this model: the mode check says it could not apply.
    assert checks["train_eval_mode"]["applicable"] is False and "not applicable" in checks["train_eval_mode"]["note"]


def test_deliberate_accumulation_cleared_after_each_step_passes(shared_gate: Shared) -> None:
    accumulated = shared_gate("corr_stale_grads_accum", *CORRECTNESS)[0]
    check = accumulated.stage("correctness")["details"]["checks"]["stale_gradients"]
    assert check["ran"] is True and check["steps_judged"] == 7 and check["steps_stale"] == 0


def test_training_left_in_eval_mode_blocks_at_the_eval_call_naming_the_forward(shared_gate: Shared) -> None:
    eval_mode = shared_gate("corr_eval_mode", *CORRECTNESS)[0]
    assert eval_mode.returncode == 1 and eval_mode.report["decision"] == "BLOCK"
    findings = {f["evidence"]["data"]["mode"]: f for f in eval_mode.findings("train-eval-mode")}
    assert set(findings) == {"eval", "train"} and len(eval_mode.findings()) == 2
    left = findings["eval"]
    assert left["severity"] == "high" and left["blocking"] is True
    assert _located(left) == _marker("corr_eval_mode", "eval")
    data = left["evidence"]["data"]
    assert _site(data["forward_site"]) == _marker("corr_eval_mode", "forward")
    assert _site(data["eval_site"]) == _marker("corr_eval_mode", "eval")
    assert {(m["name"], m["class"]) for m in data["modules"]} == {("body.1", "BatchNorm1d"), ("body.3", "Dropout")}
    # 3 epochs of 4 batches; evaluate() runs after the first epoch and never switches back.
    assert data["steps_affected"] == list(range(4, 12))


def test_a_no_grad_forward_in_train_mode_blocks_at_that_call(shared_gate: Shared) -> None:
    eval_mode = shared_gate("corr_eval_mode", *CORRECTNESS)[0]
    logged = next(f for f in eval_mode.findings("train-eval-mode") if f["evidence"]["data"]["mode"] == "train")
    assert logged["blocking"] is True and _located(logged) == _marker("corr_eval_mode", "logged")
    data = logged["evidence"]["data"]
    assert data["gradients_recorded"] is False and data["after_step"] == 4
    assert {m["name"] for m in data["modules"]} == {"body.1", "body.3"}


def test_evaluation_that_switches_back_and_update_bn_pass(shared_gate: Shared) -> None:
    eval_mode_clean = shared_gate("corr_eval_mode_clean", *CORRECTNESS)[0]
    check = eval_mode_clean.stage("correctness")["details"]["checks"]["train_eval_mode"]
    assert check["ran"] is True and check["dependent_modules"] == 2 and check["library_calls"] > 0
