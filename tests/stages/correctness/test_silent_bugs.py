"""loss-input-mismatch's shape rule, train-eval-mode's functional dropout, gradient-clipping and
data-leakage, end to end: one
`traingate run --stages correctness` per fixture target, shared by the assertions on its
report; expected lines come from `# marker:` comments.
The decision and each finding's category, severity and line are rows of
tests/e2e/test_fixture_targets.py, which reads the same run; the evidence is checked here."""

from __future__ import annotations

import pytest

from tests.correctness_runs import checks as _checks
from tests.correctness_runs import CORRECTNESS, Shared
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


def test_a_regression_loss_broadcasting_its_input_blocks_at_the_loss_call(shared_gate: Shared) -> None:
    """The loss module is called with (12, 1) predictions and (12,) targets, PyTorch's warning
    filtered out: the shapes are read on the tensors."""
    shape = shared_gate("corr_loss_shape", *CORRECTNESS)[0]
    [finding] = shape.findings()
    data = finding["evidence"]["data"]
    assert data["rule"] == "shape" and data["function"] == "huber_loss"
    assert (data["input_shape"], data["target_shape"], data["broadcast_shape"]) == ([12, 1], [12], [12, 12])
    assert data["mismatched_calls"] == data["calls"] == 8 and data["gradients_recorded"] is True
    assert "(12, 1)" in finding["title"] and "(12,)" in finding["title"]
    check = _checks(shape)["loss_input_mismatch"]
    assert check["shape_calls"] == 8 and check["shape_mismatches"] == 1


def test_the_same_loss_with_matching_shapes_passes(shared_gate: Shared) -> None:
    shape_clean = shared_gate("corr_loss_shape_clean", *CORRECTNESS)[0]
    assert _checks(shape_clean)["loss_input_mismatch"]["shape_mismatches"] == 0


def test_a_functional_dropout_left_on_in_eval_mode_blocks_at_the_call(shared_gate: Shared) -> None:
    dropout = shared_gate("corr_dropout_eval", *CORRECTNESS)[0]
    [finding] = dropout.findings()
    data = finding["evidence"]["data"]
    assert (data["function"], data["module"], data["p"]) == ("dropout2d", "ConvNet", 0.25)
    # Only the evaluation pass: the 6 training forwards ran in train mode.
    assert data["calls"] == 1 and data["after_step"] == 6
    assert "`F.dropout2d`" in finding["title"] and "training=self.training" in finding["fix"]


def test_a_clip_before_the_backward_blocks_at_the_clip_naming_the_backward(shared_gate: Shared) -> None:
    clip = shared_gate("corr_clip_early", *CORRECTNESS)[0]
    [finding] = clip.findings()
    data = finding["evidence"]["data"]
    assert data["kind"] == "before-backward" and data["function"] == "clip_grad_norm_"
    assert data["steps_affected"] == [0, 1, 2, 3, 4, 5] and data["steps_observed"] == 6
    assert _site(data["backward_site"]) == _marker("corr_clip_early", "backward")


def test_a_validation_set_split_from_another_permutation_is_data_leakage(shared_gate: Shared) -> None:
    leakage = shared_gate("corr_leakage", *CORRECTNESS)[0]
    [finding] = leakage.findings()  # the train-accuracy pass over the training subset is not one
    data = finding["evidence"]["data"]
    assert _site(data["training_loader"]) == _marker("corr_leakage", "train-loader")
    # 120 samples split 96/24 twice with different permutations: most of the 24 were trained on.
    assert data["evaluated_samples"] == 24 and data["trained_samples"] == 96 and 12 <= data["overlap"] < 24
    assert f"{data['overlap']} of the 24 samples evaluated" in finding["title"]


def test_a_new_head_frozen_with_the_backbone_blocks_at_the_line_that_froze_it(shared_gate: Shared) -> None:
    frozen_head = shared_gate("corr_frozen_head", *CORRECTNESS)[0]
    [finding] = frozen_head.findings()
    assert finding["rule"] == "unused-parameter/frozen-output"
    data = finding["evidence"]["data"]
    assert data["reason"] == "frozen-output" and data["module"] == "Linear" and data["params"] == 2
    assert _site(data["module_site"]) == _marker("corr_frozen_head", "head") and _site(data["loss_site"]) == _marker("corr_frozen_head", "loss")
    # The training loss and the validation loss given the same layer are one cause: one finding naming both.
    assert [_site(s) for s in data["loss_sites"]] == [_marker("corr_frozen_head", "loss"), _marker("corr_frozen_head", "val-loss")]
