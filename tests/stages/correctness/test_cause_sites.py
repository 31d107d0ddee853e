"""Findings located at their cause, not at their symptom: a functional softmax behind a loss, a
layer frozen by `requires_grad = False`, a head whose output reaches no loss against one cut by
`detach()`, an optimizer built over part of the model, a `log_prob` that broadcasts, and a
warm-up whose zero rate goes beyond its first step. One `traingate run --stages correctness`
per fixture target, shared by the assertions on its report.
The decision and each finding's category, severity and line are rows of
tests/e2e/test_fixture_targets.py, which reads the same run; the evidence is checked here."""

from __future__ import annotations

import pytest

from tests.correctness_runs import CORRECTNESS, Shared
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


def _line(case: str, name: str) -> str:
    path, line = _marker(case, name)
    return f"{path}:{line}"


def test_a_functional_softmax_into_cross_entropy_names_the_softmax_line(shared_gate: Shared) -> None:
    run = shared_gate("corr_loss_softmax_functional", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert data["input_kind"] == "probabilities" and data["producer"] == "SoftmaxBackward0" and data["module"] is None
    assert _site(data["producer_site"]) == _marker("corr_loss_softmax_functional", "softmax")
    assert _line("corr_loss_softmax_functional", "softmax") in finding["title"]


def test_a_head_frozen_by_a_requires_grad_assignment_blocks_at_that_assignment(shared_gate: Shared) -> None:
    run = shared_gate("corr_frozen_fc", *CORRECTNESS)[0]
    [finding] = run.findings()
    assert finding["rule"] == "unused-parameter/frozen-output"
    data = finding["evidence"]["data"]
    assert _site(data["frozen_site"]) == _marker("corr_frozen_fc", "freeze") and _site(data["module_site"]) == _marker("corr_frozen_fc", "head")
    assert f"{_line('corr_frozen_fc', 'freeze')} (`p.requires_grad = train_head" in finding["problem"]


def test_a_head_whose_output_reaches_no_loss_is_medium_and_does_not_block(shared_gate: Shared) -> None:
    run = shared_gate("corr_head_unused", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert data["reason"] == "output-unused" and {p["qualified_name"] for p in data["parameters"]} == {"head.weight", "head.bias"}
    assert all(p["watched_forward"] is True and p["cut"] is None for p in data["parameters"])
    assert "reaches no loss" in finding["problem"]


def test_a_head_cut_from_the_loss_by_detach_blocks_at_the_detach(shared_gate: Shared) -> None:
    run = shared_gate("corr_head_detached", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert data["reason"] == "no-gradient" and all(p["cut"] == "detach" for p in data["parameters"])
    assert _site(data["parameters"][0]["cut_site"]) == _marker("corr_head_detached", "detach")
    assert f"`detach()` at {_line('corr_head_detached', 'detach')}" in finding["problem"]


def test_an_encoder_in_the_optimizer_run_only_under_no_grad_blocks_at_that_call(shared_gate: Shared) -> None:
    run = shared_gate("corr_encoder_no_grad", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert data["reason"] == "no-gradient" and all(p["cut"] == "no_grad" for p in data["parameters"])
    assert "`torch.no_grad()`" in finding["problem"] and _line("corr_encoder_no_grad", "encoder") in finding["problem"]


def test_an_optimizer_over_the_encoder_only_blocks_at_its_construction(shared_gate: Shared) -> None:
    run = shared_gate("corr_optimizer_encoder_only", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert data["reason"] == "not-in-optimizer" and {p["qualified_name"].split(".")[0] for p in data["parameters"]} == {"decoder"}
    assert _site(data["optimizers"][0]["site"]) == _marker("corr_optimizer_encoder_only", "optimizer")
    assert f"optimizer built at {_line('corr_optimizer_encoder_only', 'optimizer')}" in finding["title"]
    assert _line("corr_optimizer_encoder_only", "decoder") in finding["problem"]


def test_a_log_prob_of_a_flat_mean_against_column_targets_blocks_at_the_call(shared_gate: Shared) -> None:
    run = shared_gate("corr_log_prob_shape", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert data["function"] == "Normal.log_prob" and data["gradients_recorded"] is True
    assert (data["input_shape"], data["target_shape"], data["broadcast_shape"]) == ([16], [16, 1], [16, 16])
    assert data["mismatched_calls"] == 8


def test_matching_log_prob_shapes_and_a_mixture_scored_on_purpose_pass(shared_gate: Shared) -> None:
    run = shared_gate("corr_log_prob_shape_clean", *CORRECTNESS)[0]
    check = run.stage("correctness")["details"]["checks"]["loss_input_mismatch"]
    assert check["ran"] is True and check["shape_calls"] == 9 and check["shape_mismatches"] == 0


def test_zero_rate_steps_beyond_the_warmups_first_block(shared_gate: Shared) -> None:
    run = shared_gate("corr_warmup_zero_steps", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert data["ineffective_steps"] == [0, 1] and data["cause"] == "zero-lr"
    assert "LambdaLR" in finding["problem"]


def test_eval_mode_left_on_by_a_mid_epoch_validation_blocks_at_the_eval_call(shared_gate: Shared) -> None:
    run = shared_gate("corr_eval_mid_epoch", *CORRECTNESS)[0]
    [finding] = run.findings()
    data = finding["evidence"]["data"]
    assert _site(data["forward_site"]) == _marker("corr_eval_mid_epoch", "forward") and data["steps_affected"] == [3, 4, 5, 6, 7, 8]
    assert f"`eval()` at {_line('corr_eval_mid_epoch', 'eval')}" in finding["title"]
