"""The loss-input-mismatch and batch-mixing probes on the patterns that must and must not be
found, called directly on the CPU without installing them (installing would patch this
process's torch), and the parent side's severities on their payloads."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from traingate.pipeline.model.config import TargetConfig  # noqa: E402
from traingate.stages.correctness.details import MixingCheck, NotApplicable  # noqa: E402
from traingate.pipeline.model.schema import Location, Severity  # noqa: E402
from traingate.stages.base import StageContext  # noqa: E402
from traingate.stages.correctness.probe.payloads import LossInputsPayload, MixingPayload  # noqa: E402
from traingate.stages.correctness.loss_inputs import loss_input_check  # noqa: E402
from traingate.stages.correctness.mixing import mixing_check  # noqa: E402
from traingate.stages.correctness.probe.loss_inputs import CALLS_PER_SITE, LossInputWatch, classify  # noqa: E402
from traingate.stages.correctness.probe.mixing import Capture  # noqa: E402
from traingate.stages.correctness.probe.mixing_replay import judge  # noqa: E402
from traingate.stages.harness.sites import SiteTable  # noqa: E402

HERE = Path(__file__).parent
F = torch.nn.functional


def _ctx(tmp_path: Path) -> StageContext:
    return StageContext(stage="correctness", root=tmp_path, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=tmp_path)


# -- loss-input-mismatch --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_rows_are_classified_by_what_they_are_in_every_precision(dtype: Any) -> None:
    torch.manual_seed(0)
    logits = torch.randn(8, 5, dtype=dtype)
    assert classify(torch, "cross_entropy", torch.softmax(logits.float(), -1).to(dtype)) == "probabilities"
    assert classify(torch, "cross_entropy", torch.log_softmax(logits.float(), -1).to(dtype)) == "log-probabilities"
    assert classify(torch, "nll_loss", logits) == "logits"
    # Log-probabilities of a subset of the classes: exp sums below 1, not judged as logits.
    assert classify(torch, "nll_loss", torch.log_softmax(logits.float(), -1)[:, :3].to(dtype)) == "other"
    assert classify(torch, "binary_cross_entropy_with_logits", torch.sigmoid(logits.float()).to(dtype)) == "unit-interval"
    assert classify(torch, "binary_cross_entropy_with_logits", logits) == "logits"


def _loss_watch() -> LossInputWatch:
    watch = LossInputWatch()
    watch.torch = torch
    watch.sites = SiteTable(HERE)
    return watch


def test_a_softmax_module_feeding_cross_entropy_is_named_and_sampled_a_few_times(tmp_path: Path) -> None:
    watch = _loss_watch()
    torch.manual_seed(0)
    softmax, linear = torch.nn.Softmax(dim=-1), torch.nn.Linear(4, 3)
    for _ in range(CALLS_PER_SITE + 3):
        probabilities = softmax(linear(torch.randn(8, 4)))
        watch._forward(softmax, (), probabilities)  # the global forward hook's call
        watch.observe("cross_entropy", probabilities)
    watch.observe("cross_entropy", linear(torch.randn(2, 3, 4)).permute(0, 2, 1))  # (N, C, d1): classes on dim 1
    result = watch.collect()
    LossInputsPayload.model_validate(result)
    fed, spatial = result["losses"]
    assert fed["kind"] == "probabilities" and fed["module"] == "Softmax" and fed["producer"] == "SoftmaxBackward0"
    assert fed["calls"] == CALLS_PER_SITE + 3 and fed["sampled"] == CALLS_PER_SITE and fed["gradients_recorded"] is True
    assert spatial["kind"] == "logits" and spatial["module"] is None
    [finding] = loss_input_check(_ctx(tmp_path), LossInputsPayload.model_validate(result), Location(path="train.py"))[0]
    assert finding.category.value == "loss-input-mismatch" and finding.severity is Severity.HIGH and finding.blocking


def test_a_sigmoid_module_is_named_behind_the_views_its_output_went_through() -> None:
    watch = _loss_watch()
    sigmoid = torch.nn.Sigmoid()
    probabilities = sigmoid(torch.nn.Linear(4, 1)(torch.randn(8, 4)))
    watch._forward(sigmoid, (), probabilities)
    watch.observe("binary_cross_entropy_with_logits", probabilities.squeeze(1))
    [seen] = watch.collect()["losses"]
    assert seen["kind"] == "unit-interval" and seen["producer"] == "SigmoidBackward0" and seen["module"] == "Sigmoid"


def _judged(tmp_path: Path, tensors: list[tuple[str, Any]], grad: bool = True) -> list[Any]:
    watch = _loss_watch()
    with torch.set_grad_enabled(grad):
        for function, tensor in tensors:
            watch.observe(function, tensor)
    return loss_input_check(_ctx(tmp_path), LossInputsPayload.model_validate(watch.collect()), Location(path="train.py"))[0]


def test_the_right_inputs_give_no_finding(tmp_path: Path) -> None:
    logits = torch.nn.Linear(4, 3)(torch.randn(8, 4))
    right = [("cross_entropy", logits), ("nll_loss", torch.log_softmax(logits, -1)), ("binary_cross_entropy_with_logits", logits[:, 0] - 5)]
    assert _judged(tmp_path, right) == []


def test_severity_follows_the_evidence(tmp_path: Path) -> None:
    logits = torch.nn.Linear(4, 3)(torch.randn(8, 4))
    twice, nll, sigmoid = _judged(tmp_path, [("cross_entropy", torch.log_softmax(logits, -1)), ("nll_loss", logits), ("binary_cross_entropy_with_logits", torch.sigmoid(logits))])
    assert twice.severity is Severity.LOW and not twice.blocking  # log-softmax twice: the same loss
    assert nll.severity is Severity.HIGH and nll.blocking and sigmoid.severity is Severity.HIGH
    # Values in [0, 1] that no sigmoid made, and a loss that recorded no gradients: not blocking.
    [unsure] = _judged(tmp_path, [("binary_cross_entropy_with_logits", torch.rand(16, requires_grad=True) * 1)])
    [validation] = _judged(tmp_path, [("cross_entropy", torch.softmax(logits.detach(), -1))], grad=False)
    assert unsure.severity is Severity.MEDIUM and validation.severity is Severity.MEDIUM and not validation.blocking


# -- batch-mixing ---------------------------------------------------------------------------------


class _Sequence(torch.nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout
        self.rnn = torch.nn.GRU(3, 8)
        self.norm = torch.nn.BatchNorm1d(8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: Any) -> Any:
        b, t, f = x.shape
        steps = x.view(t, b, f) if self.layout == "view" else x.transpose(0, 1)
        out, _ = self.rnn(steps)
        return self.head(self.norm(out[-1]))


class _Centred(torch.nn.Module):
    """Subtracts the batch's mean: every output depends on every sample."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)
        self.head = torch.nn.Linear(4, 2)

    def forward(self, tokens: Any) -> Any:
        h = self.embed(tokens).mean(1)
        return self.head(h - h.mean(0))


def _capture(model: Any, *args: Any, batch_size: int | None = 6, shapes: set[tuple[int, ...]] | None = None) -> Capture:
    shapes = {tuple(args[0].shape)} if shapes is None and batch_size else (shapes or set())
    return Capture(model, args, {}, batch_size, shapes, None, [])


def _mixing(capture: Capture) -> dict[str, Any]:
    sites = SiteTable(HERE)
    result = {"steps": 1, "captured": 1, "site": None, **judge(torch, capture, sites), "sites": sites.sites}
    MixingPayload.model_validate(result)
    return result


def test_a_view_where_transpose_was_meant_mixes_samples_at_the_rnn() -> None:
    torch.manual_seed(0)
    model = _Sequence("view").train()
    result = _mixing(_capture(model, torch.randn(6, 5, 3)))
    assert result["applicable"] and result["batch_dim"] == 0 and result["batch_dim_assumed"] is False
    assert all(s["others_count"] > 0 for s in result["samples"])
    assert result["mixing_op"]["name"] == "gru" and result["layout_op"]["name"] == "view"
    codes = [result["sites"][result[k]["site"]]["code"] for k in ("mixing_op", "layout_op")]
    assert codes == ["out, _ = self.rnn(steps)", "steps = x.view(t, b, f) if self.layout == \"view\" else x.transpose(0, 1)"]
    # The replay ran in eval mode and put the modes back.
    assert model.training and model.norm.training


def test_transpose_and_batchnorm_in_eval_mode_are_clean(tmp_path: Path) -> None:
    torch.manual_seed(0)
    result = _mixing(_capture(_Sequence("transpose").train(), torch.randn(6, 5, 3)))
    assert result["applicable"] and [s["others_count"] for s in result["samples"]] == [0, 0]
    assert "mixing_op" not in result
    findings, record = mixing_check(_ctx(tmp_path), MixingPayload.model_validate(result), Location(path="train.py"))
    assert findings == [] and isinstance(record, MixingCheck) and record.ran and record.mixed is False


def test_a_reduction_over_the_batch_behind_an_embedding_is_found(tmp_path: Path) -> None:
    torch.manual_seed(0)
    result = _mixing(_capture(_Centred(), torch.randint(0, 10, (6, 7))))
    assert result["applicable"] and all(s["others_count"] == 5 for s in result["samples"])
    assert result["mixing_op"]["name"] == "mean" and result["sites"][result["mixing_op"]["site"]]["code"] == "return self.head(h - h.mean(0))"
    [finding] = mixing_check(_ctx(tmp_path), MixingPayload.model_validate(result), Location(path="train.py"))[0]
    assert finding.severity is Severity.HIGH and finding.blocking and finding.location.line == result["sites"][result["mixing_op"]["site"]]["line"]


def test_without_a_dataloader_dim_0_is_assumed_and_does_not_block(tmp_path: Path) -> None:
    result = _mixing(_capture(_Centred(), torch.randint(0, 10, (6, 7)), batch_size=None))
    assert result["batch_dim_assumed"] is True
    [finding] = mixing_check(_ctx(tmp_path), MixingPayload.model_validate(result), Location(path="train.py"))[0]
    assert finding.severity is Severity.MEDIUM and not finding.blocking


class _TimeMajor(torch.nn.Module):
    """A recurrent model fed (time, batch, features), torch's default layout: clean."""

    def __init__(self) -> None:
        super().__init__()
        self.rnn = torch.nn.LSTM(3, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, x: Any) -> Any:
        out, _ = self.rnn(x)
        return self.head(out)


def test_a_time_major_recurrent_model_without_a_dataloader_is_judged_along_its_batch(tmp_path: Path) -> None:
    torch.manual_seed(0)
    result = _mixing(_capture(_TimeMajor(), torch.randn(5, 6, 3), batch_size=None))
    assert result["applicable"] and result["batch_dim"] == 1 and result["batch_dim_assumed"] is True
    assert [s["others_count"] for s in result["samples"]] == [0, 0] and "mixing_op" not in result
    findings, _ = mixing_check(_ctx(tmp_path), MixingPayload.model_validate(result), Location(path="train.py"))
    assert findings == []


@pytest.mark.parametrize(
    ("args", "batch_size", "shapes", "reason"),
    [
        ((), 6, set(), "takes no tensor batch"),
        ((torch.randn(1, 5, 3),), 1, {(1, 5, 3)}, "single sample"),
        ((torch.randn(5, 6, 6),), 6, set(), "no dimension of the model's input"),  # reordered, two dims of 6
    ],
)
def test_a_batch_it_cannot_identify_is_not_applicable(tmp_path: Path, args: tuple[Any, ...], batch_size: int, shapes: set[tuple[int, ...]], reason: str) -> None:
    result = _mixing(_capture(_Sequence("transpose"), *args, batch_size=batch_size, shapes=shapes))
    assert result["applicable"] is False and reason in result["reason"]
    findings, record = mixing_check(_ctx(tmp_path), MixingPayload.model_validate(result), Location(path="train.py"))
    assert findings == [] and isinstance(record, NotApplicable) and record.applicable is False and record.note.startswith("not applicable")
