"""loss-input-mismatch's shape rule, train-eval-mode's functional dropout, gradient-clipping and
data-leakage, end to end: one
`traingate run --stages correctness` per fixture target, shared by the assertions on its
report; expected lines come from `# marker:` comments."""

from __future__ import annotations

import pytest

from tests.conftest import GateRun
from tests.correctness_runs import checks as _checks
from tests.correctness_runs import correctness_gate as _gate
from tests.correctness_runs import located as _located
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def shape(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_loss_shape", tmp_path_factory)


@pytest.fixture(scope="module")
def shape_clean(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_loss_shape_clean", tmp_path_factory)


@pytest.fixture(scope="module")
def clip(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_clip_early", tmp_path_factory)


@pytest.fixture(scope="module")
def clip_clean(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_clip_early_clean", tmp_path_factory)


@pytest.fixture(scope="module")
def leakage(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_leakage", tmp_path_factory)


@pytest.fixture(scope="module")
def leakage_clean(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_leakage_clean", tmp_path_factory)


@pytest.fixture(scope="module")
def frozen_head(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_frozen_head", tmp_path_factory)


@pytest.fixture(scope="module")
def frozen_backbone(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_frozen_head_clean", tmp_path_factory)


@pytest.fixture(scope="module")
def dropout(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_dropout_eval", tmp_path_factory)


@pytest.fixture(scope="module")
def dropout_clean(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _gate("corr_dropout_eval_clean", tmp_path_factory)


def test_a_regression_loss_broadcasting_its_input_blocks_at_the_loss_call(shape: GateRun) -> None:
    """The loss module is called with (12, 1) predictions and (12,) targets, PyTorch's warning
    filtered out: the shapes are read on the tensors."""
    assert shape.returncode == 1 and shape.report["decision"] == "BLOCK"
    [finding] = shape.findings()
    assert finding["category"] == "loss-input-mismatch" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_loss_shape", "loss")
    data = finding["evidence"]["data"]
    assert data["rule"] == "shape" and data["function"] == "huber_loss"
    assert (data["input_shape"], data["target_shape"], data["broadcast_shape"]) == ([12, 1], [12], [12, 12])
    assert data["mismatched_calls"] == data["calls"] == 8 and data["gradients_recorded"] is True
    assert "(12, 1)" in finding["title"] and "(12,)" in finding["title"]
    check = _checks(shape)["loss_input_mismatch"]
    assert check["shape_calls"] == 8 and check["shape_mismatches"] == 1


def test_the_same_loss_with_matching_shapes_passes(shape_clean: GateRun) -> None:
    assert shape_clean.returncode == 0 and shape_clean.report["decision"] == "PASS"
    assert shape_clean.findings() == []
    assert _checks(shape_clean)["loss_input_mismatch"]["shape_mismatches"] == 0


def test_a_functional_dropout_left_on_in_eval_mode_blocks_at_the_call(dropout: GateRun) -> None:
    assert dropout.returncode == 1 and dropout.report["decision"] == "BLOCK"
    [finding] = dropout.findings()
    assert finding["category"] == "train-eval-mode" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_dropout_eval", "dropout")
    data = finding["evidence"]["data"]
    assert (data["function"], data["module"], data["p"]) == ("dropout2d", "ConvNet", 0.25)
    # Only the evaluation pass: the 6 training forwards ran in train mode.
    assert data["calls"] == 1 and data["after_step"] == 6
    assert "`F.dropout2d`" in finding["title"] and "training=self.training" in finding["fix"]


def test_the_functional_dropout_following_the_module_mode_passes(dropout_clean: GateRun) -> None:
    assert dropout_clean.returncode == 0 and dropout_clean.report["decision"] == "PASS"
    assert dropout_clean.findings() == []


def test_a_clip_before_the_backward_blocks_at_the_clip_naming_the_backward(clip: GateRun) -> None:
    assert clip.returncode == 1 and clip.report["decision"] == "BLOCK"
    [finding] = clip.findings()
    assert finding["category"] == "gradient-clipping" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_clip_early", "clip")
    data = finding["evidence"]["data"]
    assert data["kind"] == "before-backward" and data["function"] == "clip_grad_norm_"
    assert data["steps_affected"] == [0, 1, 2, 3, 4, 5] and data["steps_observed"] == 6
    assert _site(data["backward_site"]) == _marker("corr_clip_early", "backward")


def test_the_clip_after_the_backward_passes(clip_clean: GateRun) -> None:
    assert clip_clean.returncode == 0 and clip_clean.report["decision"] == "PASS"
    assert clip_clean.findings() == []


def test_a_validation_set_split_from_another_permutation_is_data_leakage(leakage: GateRun) -> None:
    assert leakage.returncode == 1 and leakage.report["decision"] == "BLOCK"
    [finding] = leakage.findings()  # the train-accuracy pass over the training subset is not one
    assert finding["category"] == "data-leakage" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_leakage", "val-loader")
    data = finding["evidence"]["data"]
    assert _site(data["training_loader"]) == _marker("corr_leakage", "train-loader")
    # 120 samples split 96/24 twice with different permutations: most of the 24 were trained on.
    assert data["evaluated_samples"] == 24 and data["trained_samples"] == 96 and 12 <= data["overlap"] < 24
    assert f"{data['overlap']} of the 24 samples evaluated" in finding["title"]


def test_one_split_with_a_train_accuracy_pass_passes(leakage_clean: GateRun) -> None:
    assert leakage_clean.returncode == 0 and leakage_clean.report["decision"] == "PASS"
    assert leakage_clean.findings() == []


def test_a_new_head_frozen_with_the_backbone_blocks_at_the_line_that_froze_it(frozen_head: GateRun) -> None:
    assert frozen_head.returncode == 1 and frozen_head.report["decision"] == "BLOCK"
    [finding] = frozen_head.findings()
    assert finding["category"] == "unused-parameter" and finding["rule"] == "unused-parameter/frozen-output"
    assert finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_frozen_head", "freeze")
    data = finding["evidence"]["data"]
    assert data["reason"] == "frozen-output" and data["module"] == "Linear" and data["params"] == 2
    assert _site(data["module_site"]) == _marker("corr_frozen_head", "head") and _site(data["loss_site"]) == _marker("corr_frozen_head", "loss")
    # The training loss and the validation loss given the same layer are one cause: one finding naming both.
    assert [_site(s) for s in data["loss_sites"]] == [_marker("corr_frozen_head", "loss"), _marker("corr_frozen_head", "val-loss")]


def test_a_frozen_pretrained_backbone_with_a_training_head_passes(frozen_backbone: GateRun) -> None:
    assert frozen_backbone.returncode == 0 and frozen_backbone.report["decision"] == "PASS"
    assert frozen_backbone.findings() == []
