"""Findings located at their cause, not at their symptom: a functional softmax behind a loss, a
layer frozen by `requires_grad = False`, a head whose output reaches no loss against one cut by
`detach()`, an optimizer built over part of the model, a `log_prob` that broadcasts, and a
warm-up whose zero rate goes beyond its first step. One `traingate run --stages correctness`
per fixture target, shared by the assertions on its report."""

from __future__ import annotations

import pytest

from tests.conftest import GateRun
from tests.correctness_runs import correctness_gate as _gate
from tests.correctness_runs import located as _located
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GateRun]:
    cases = (
        "corr_loss_softmax_functional", "corr_frozen_fc", "corr_frozen_fc_clean", "corr_head_unused", "corr_head_detached",
        "corr_optimizer_encoder_only", "corr_optimizer_encoder_only_clean", "corr_log_prob_shape", "corr_log_prob_shape_clean", "corr_warmup_zero_steps",
        "corr_encoder_no_grad", "corr_eval_mid_epoch", "corr_eval_mid_epoch_clean",
    )
    return {case: _gate(case, tmp_path_factory) for case in cases}


def _line(case: str, name: str) -> str:
    path, line = _marker(case, name)
    return f"{path}:{line}"


def test_a_functional_softmax_into_cross_entropy_names_the_softmax_line(runs: dict[str, GateRun]) -> None:
    run = runs["corr_loss_softmax_functional"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "loss-input-mismatch" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_loss_softmax_functional", "loss")
    data = finding["evidence"]["data"]
    assert data["input_kind"] == "probabilities" and data["producer"] == "SoftmaxBackward0" and data["module"] is None
    assert _site(data["producer_site"]) == _marker("corr_loss_softmax_functional", "softmax")
    assert _line("corr_loss_softmax_functional", "softmax") in finding["title"]


def test_a_head_frozen_by_a_requires_grad_assignment_blocks_at_that_assignment(runs: dict[str, GateRun]) -> None:
    run = runs["corr_frozen_fc"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["rule"] == "unused-parameter/frozen-output" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_frozen_fc", "freeze")
    data = finding["evidence"]["data"]
    assert _site(data["frozen_site"]) == _marker("corr_frozen_fc", "freeze") and _site(data["module_site"]) == _marker("corr_frozen_fc", "head")
    assert f"{_line('corr_frozen_fc', 'freeze')} (`p.requires_grad = train_head" in finding["problem"]


def test_a_backbone_frozen_by_assignment_with_a_training_head_passes(runs: dict[str, GateRun]) -> None:
    run = runs["corr_frozen_fc_clean"]
    assert run.returncode == 0 and run.report["decision"] == "PASS" and run.findings() == []


def test_a_head_whose_output_reaches_no_loss_is_medium_and_does_not_block(runs: dict[str, GateRun]) -> None:
    run = runs["corr_head_unused"]
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    [finding] = run.findings()
    assert finding["category"] == "unused-parameter" and finding["severity"] == "medium" and finding["blocking"] is False
    assert _located(finding) == _marker("corr_head_unused", "head")
    data = finding["evidence"]["data"]
    assert data["reason"] == "output-unused" and {p["qualified_name"] for p in data["parameters"]} == {"head.weight", "head.bias"}
    assert all(p["watched_forward"] is True and p["cut"] is None for p in data["parameters"])
    assert "reaches no loss" in finding["problem"]


def test_a_head_cut_from_the_loss_by_detach_blocks_at_the_detach(runs: dict[str, GateRun]) -> None:
    run = runs["corr_head_detached"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "unused-parameter" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_head_detached", "detach")
    data = finding["evidence"]["data"]
    assert data["reason"] == "no-gradient" and all(p["cut"] == "detach" for p in data["parameters"])
    assert _site(data["parameters"][0]["cut_site"]) == _marker("corr_head_detached", "detach")
    assert f"`detach()` at {_line('corr_head_detached', 'detach')}" in finding["problem"]


def test_an_encoder_in_the_optimizer_run_only_under_no_grad_blocks_at_that_call(runs: dict[str, GateRun]) -> None:
    run = runs["corr_encoder_no_grad"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "unused-parameter" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_encoder_no_grad", "no-grad")
    data = finding["evidence"]["data"]
    assert data["reason"] == "no-gradient" and all(p["cut"] == "no_grad" for p in data["parameters"])
    assert "`torch.no_grad()`" in finding["problem"] and _line("corr_encoder_no_grad", "encoder") in finding["problem"]


def test_an_optimizer_over_the_encoder_only_blocks_at_its_construction(runs: dict[str, GateRun]) -> None:
    run = runs["corr_optimizer_encoder_only"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "unused-parameter" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_optimizer_encoder_only", "optimizer")
    data = finding["evidence"]["data"]
    assert data["reason"] == "not-in-optimizer" and {p["qualified_name"].split(".")[0] for p in data["parameters"]} == {"decoder"}
    assert _site(data["optimizers"][0]["site"]) == _marker("corr_optimizer_encoder_only", "optimizer")
    assert f"optimizer built at {_line('corr_optimizer_encoder_only', 'optimizer')}" in finding["title"]
    assert _line("corr_optimizer_encoder_only", "decoder") in finding["problem"]


def test_an_optimizer_over_the_whole_model_passes(runs: dict[str, GateRun]) -> None:
    run = runs["corr_optimizer_encoder_only_clean"]
    assert run.returncode == 0 and run.report["decision"] == "PASS" and run.findings() == []


def test_a_log_prob_of_a_flat_mean_against_column_targets_blocks_at_the_call(runs: dict[str, GateRun]) -> None:
    run = runs["corr_log_prob_shape"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "loss-input-mismatch" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_log_prob_shape", "log-prob")
    data = finding["evidence"]["data"]
    assert data["function"] == "Normal.log_prob" and data["gradients_recorded"] is True
    assert (data["input_shape"], data["target_shape"], data["broadcast_shape"]) == ([16], [16, 1], [16, 16])
    assert data["mismatched_calls"] == 8


def test_matching_log_prob_shapes_and_a_mixture_scored_on_purpose_pass(runs: dict[str, GateRun]) -> None:
    run = runs["corr_log_prob_shape_clean"]
    assert run.returncode == 0 and run.report["decision"] == "PASS" and run.findings() == []
    check = run.stage("correctness")["details"]["checks"]["loss_input_mismatch"]
    assert check["ran"] is True and check["shape_calls"] == 9 and check["shape_mismatches"] == 0


def test_zero_rate_steps_beyond_the_warmups_first_block(runs: dict[str, GateRun]) -> None:
    run = runs["corr_warmup_zero_steps"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "ineffective-step" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_warmup_zero_steps", "step")
    data = finding["evidence"]["data"]
    assert data["ineffective_steps"] == [0, 1] and data["cause"] == "zero-lr"
    assert "LambdaLR" in finding["problem"]


def test_eval_mode_left_on_by_a_mid_epoch_validation_blocks_at_the_eval_call(runs: dict[str, GateRun]) -> None:
    run = runs["corr_eval_mid_epoch"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "train-eval-mode" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_eval_mid_epoch", "eval")
    data = finding["evidence"]["data"]
    assert _site(data["forward_site"]) == _marker("corr_eval_mid_epoch", "forward") and data["steps_affected"] == [3, 4, 5, 6, 7, 8]
    assert f"`eval()` at {_line('corr_eval_mid_epoch', 'eval')}" in finding["title"]


def test_a_mid_epoch_validation_that_switches_back_passes(runs: dict[str, GateRun]) -> None:
    run = runs["corr_eval_mid_epoch_clean"]
    assert run.returncode == 0 and run.report["decision"] == "PASS" and run.findings() == []
