"""The stale-gradients and train-eval-mode probes on the patterns that must and must not be
found. Their hooks are called directly (a module's own forward pre-hook stands in for the
global one), on the CPU, without installing them: installing would patch this process's torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from traingate.stages.correctness.probe.payloads import GradientsPayload, ModesPayload  # noqa: E402
from traingate.stages.correctness.probe.gradients import StaleGradientWatch  # noqa: E402
from traingate.stages.correctness.probe.modes import ModeWatch  # noqa: E402
from traingate.stages.harness.sites import SiteTable  # noqa: E402

HERE = Path(__file__).parent


def _gradient_watch() -> StaleGradientWatch:
    watch = StaleGradientWatch()
    watch.torch = torch
    watch.sites = SiteTable(HERE)
    return watch


def _backward(watch: StaleGradientWatch, loss: Any) -> None:
    watch._before_backward()
    loss.backward()


def _step(watch: StaleGradientWatch, optimizer: Any, closure: Callable[[], Any] | None = None) -> None:
    optimizer.step(closure) if closure is not None else optimizer.step()
    watch._post(optimizer, (), {})


def _linear(dtype: Any = torch.float32) -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1).to(dtype)
    return model, torch.randn(8, 4, dtype=dtype), torch.randn(8, 1, dtype=dtype)


def _train(clear: str, steps: int = 5, dtype: Any = torch.float32) -> dict[str, Any]:
    model, x, y = _linear(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = _gradient_watch()
    for _ in range(steps):
        if clear == "zero_grad":
            optimizer.zero_grad()
        elif clear == "in-place":
            optimizer.zero_grad(set_to_none=False)
        elif clear == "assign-none":
            for p in model.parameters():
                p.grad = None
        micro = 3 if clear == "accumulate" else 1
        for k in range(micro):
            _backward(watch, ((model(x[k:]) - y[k:]) ** 2).mean() / micro)
        _step(watch, optimizer)
        if clear == "accumulate":
            optimizer.zero_grad(set_to_none=True)
    return watch.collect()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_gradients_never_cleared_are_carried_into_every_later_step(dtype: Any) -> None:
    result = _train("never", dtype=dtype)
    GradientsPayload.model_validate(result)
    assert result["judged"] == 4 and result["stale_count"] == 4
    assert [s["step"] for s in result["stale"]] == [1, 2, 3, 4]
    assert all(s["params_carrying"] == 2 and s["params"] == 2 and s["carried_share"] > 0 for s in result["stale"])


@pytest.mark.parametrize("clear", ["zero_grad", "in-place", "assign-none", "accumulate"])
def test_gradients_cleared_once_per_step_or_accumulated_on_purpose_are_clean(clear: str) -> None:
    result = _train(clear)
    assert result["judged"] == 4 and result["stale_count"] == 0 and result["stale"] == []


@pytest.mark.parametrize("cleared", [False, True])
def test_sparse_complex_and_mixed_precision_gradients_are_read(cleared: bool) -> None:
    torch.manual_seed(0)
    embedding = torch.nn.Embedding(10, 3, sparse=True)
    rotation = torch.nn.Parameter(torch.randn(3, dtype=torch.complex64))
    scale = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    optimizer = torch.optim.SGD([*embedding.parameters(), rotation, scale], lr=0.1)
    watch = _gradient_watch()
    for step in range(3):
        if cleared:
            optimizer.zero_grad()
        out = (embedding(torch.tensor([step, step + 1])) * rotation).abs().sum() * scale
        _backward(watch, out.sum())
        _step(watch, optimizer)
    result = watch.collect()
    assert result["judged"] == 2 and result["stale_count"] == (0 if cleared else 2)
    if not cleared:
        assert all(s["params_carrying"] == 3 for s in result["stale"])


def test_one_optimizers_gradients_left_by_another_models_backward_are_not_stale() -> None:
    """A GAN: the generator's loss flows into the discriminator, whose gradients are cleared
    before its own backward; each optimizer is judged on its own parameters."""
    generator, x, _ = _linear()
    discriminator = torch.nn.Linear(1, 1)
    g_opt, d_opt = torch.optim.SGD(generator.parameters(), lr=0.1), torch.optim.SGD(discriminator.parameters(), lr=0.1)
    watch = _gradient_watch()
    for _ in range(4):
        d_opt.zero_grad()
        _backward(watch, discriminator(generator(x).detach()).mean())
        _step(watch, d_opt)
        g_opt.zero_grad()
        _backward(watch, discriminator(generator(x)).mean())
        _step(watch, g_opt)
    result = watch.collect()
    assert result["judged"] == 6 and result["stale_count"] == 0


def test_a_closure_that_clears_inside_the_step_is_clean() -> None:
    model, x, y = _linear()
    optimizer = torch.optim.LBFGS(model.parameters(), max_iter=3)
    watch = _gradient_watch()

    def closure() -> Any:
        optimizer.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        _backward(watch, loss)
        return loss

    for _ in range(3):
        _step(watch, optimizer, closure)
    result = watch.collect()
    assert result["judged"] == 2 and result["stale_count"] == 0


class _Net(torch.nn.Module):
    def __init__(self, dropout: float = 0.3, track: bool = True) -> None:
        super().__init__()
        self.backbone = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8, track_running_stats=track))
        self.drop = torch.nn.Dropout(dropout)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, x: Any) -> Any:
        return self.head(self.drop(self.backbone(x)))


class _Wrapper(torch.nn.Module):
    """Stands in for DistributedDataParallel: the model called is the wrapper."""

    def __init__(self, module: Any) -> None:
        super().__init__()
        self.module = module

    def forward(self, x: Any) -> Any:
        return self.module(x)


def _mode_watch(model: Any) -> ModeWatch:
    watch = ModeWatch()
    watch.torch = torch
    watch.root = HERE
    watch.sites = SiteTable(HERE)
    watch._call_codes = {torch.nn.Module._wrapped_call_impl.__code__, torch.nn.Module._call_impl.__code__}
    for module in model.modules():
        module.register_forward_pre_hook(watch._forward)
    return watch


def _set(watch: ModeWatch, module: Any, mode: bool) -> None:
    module.train(mode)
    watch._note_setter(module, mode)


def _run(pattern: str, *, dropout: float = 0.3, track: bool = True, wrap: bool = False) -> dict[str, Any]:
    torch.manual_seed(0)
    net = _Net(dropout, track)
    model = _Wrapper(net) if wrap else net
    watch = _mode_watch(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for it in range(4):
        if pattern == "frozen-norm":
            _set(watch, net.backbone[1], False)
        if pattern == "frozen-backbone":
            _set(watch, net.backbone, False)
        optimizer.zero_grad()
        ((model(x) - y) ** 2).mean().backward()
        optimizer.step()
        watch._post(optimizer, (), {})
        if it == 1 and pattern in ("eval-left", "eval-undone"):
            _set(watch, net if wrap else model, False)
            with torch.no_grad():
                model(x)
            if pattern == "eval-undone":
                _set(watch, model, True)
        if it == 1 and pattern in ("no-grad", "inference"):
            with torch.no_grad() if pattern == "no-grad" else torch.inference_mode():
                model(x)
        if it == 1 and pattern == "update-bn":
            torch.optim.swa_utils.update_bn([x], model)
    return watch.collect()


def test_a_model_left_in_eval_mode_by_evaluation_is_trained_in_eval_mode() -> None:
    result = _run("eval-left")
    ModesPayload.model_validate(result)
    [record] = result["eval_while_training"]
    assert record["steps"] == 2 and record["step_indexes"] == [2, 3] and record["root"] == "_Net"
    assert {(m["name"], m["kind"]) for m in record["modules"]} == {("backbone.1", "norm"), ("drop", "dropout")}
    assert result["sites"][record["site"]]["function"] == "_run" and "model(x)" in result["sites"][record["site"]]["code"]
    assert result["train_under_no_grad"] == []


def test_eval_on_the_inner_model_of_a_wrapper_counts_as_the_whole_model() -> None:
    [record] = _run("eval-left", wrap=True)["eval_while_training"]
    assert record["root"] == "_Wrapper" and record["steps"] == 2


@pytest.mark.parametrize("pattern", ["eval-undone", "frozen-norm", "frozen-backbone", "update-bn"])
def test_evaluation_that_switches_back_parts_frozen_on_purpose_and_library_calls_are_clean(pattern: str) -> None:
    result = _run(pattern)
    assert result["dependent_modules"] == 2
    assert result["eval_while_training"] == [] and result["train_under_no_grad"] == []
    if pattern.startswith("frozen"):
        assert result["frozen_on_purpose"] > 0
    if pattern == "update-bn":
        assert result["library_calls"] > 0


@pytest.mark.parametrize("pattern", ["no-grad", "inference"])
def test_a_forward_without_gradients_in_train_mode_names_the_modules(pattern: str) -> None:
    result = _run(pattern)
    ModesPayload.model_validate(result)
    [record] = result["train_under_no_grad"]
    assert record["inference_mode"] is (pattern == "inference") and record["first_step"] == 2
    assert {m["name"] for m in record["modules"]} == {"backbone.1", "drop"}
    assert result["eval_while_training"] == []


def test_dropout_zero_and_batch_statistics_only_norms_do_not_depend_on_the_mode() -> None:
    result = _run("eval-left", dropout=0.0, track=False)
    assert result["dependent_modules"] == 0 and result["eval_while_training"] == []
