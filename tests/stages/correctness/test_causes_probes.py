"""Why an optimizer step changed nothing (`probe.causes`), every step counted across itself, and
whether a no-grad forward's outputs fed the step's loss (`probe.loss_feeds`). The probes'
wrappers and hooks are called directly, on the CPU, without installing them: installing would
patch this process's torch."""

from __future__ import annotations

import warnings
import weakref
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from traingate.stages.correctness.probe.payloads import StepsPayload  # noqa: E402
from traingate.stages.correctness.probe.causes import StepCauses  # noqa: E402
from traingate.stages.correctness.probe.loss_feeds import LossFeeds  # noqa: E402
from traingate.stages.harness.sites import SiteTable  # noqa: E402
from traingate.stages.correctness.probe.steps import StepWatch  # noqa: E402

HERE = Path(__file__).parent


class _Loop:
    """A StepWatch with its causes, and the wrapped calls a target's loop would make."""

    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer
        self.watch = StepWatch()
        self.watch.torch = torch
        self.watch.sites = SiteTable(HERE)
        self.watch.modules = [(model, None)]
        self.causes = self.watch.causes = StepCauses(self.watch.sites)
        self.causes.torch = torch
        self.causes._made.append(weakref.ref(optimizer))
        self.backward = self.causes._backward(torch.Tensor.backward)
        self.optimizer_zero_grad = self.causes._clearing(torch.optim.Optimizer.zero_grad, "Optimizer.zero_grad")
        self.module_zero_grad = self.causes._clearing(torch.nn.Module.zero_grad, "Module.zero_grad")

    def loss(self) -> Any:
        x = torch.randn(8, 4)
        return ((self.model(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()

    def step(self) -> None:
        self.watch._pre(self.optimizer, (), {})
        self.optimizer.step()
        self.watch._post(self.optimizer, (), {})

    def collect(self) -> dict[str, Any]:
        return StepsPayload.model_validate(self.watch.collect()).model_dump(mode="json", by_alias=True, exclude_unset=True)


def _loop(lr: float = 0.1) -> _Loop:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
    return _Loop(model, torch.optim.SGD(model.parameters(), lr=lr))


@pytest.mark.parametrize("clear", ["optimizer", "module", "assign-none", "zeroed"])
def test_gradients_cleared_after_the_backward_are_the_cause_of_every_step(clear: str) -> None:
    loop = _loop()
    for _ in range(4):
        loop.backward(loop.loss())
        if clear == "optimizer":
            loop.optimizer_zero_grad(loop.optimizer)
        elif clear == "module":
            loop.module_zero_grad(loop.model)
        elif clear == "assign-none":
            for p in loop.model.parameters():
                p.grad = None
        else:
            for p in loop.model.parameters():
                p.grad.zero_()
        loop.step()
    result = loop.collect()
    assert result["ineffective_count"] == 4 and [r["step"] for r in result["ineffective"]] == [0, 1, 2, 3]
    first = result["ineffective"][0]
    assert first["cause"] == "cleared" and first["grads_after_backward"] == 4
    if clear in ("optimizer", "module"):
        assert first["clear_call"] == ("Optimizer.zero_grad" if clear == "optimizer" else "Module.zero_grad")
        assert result["sites"][first["clear_site"]]["code"].startswith("loop.optimizer_zero_grad" if clear == "optimizer" else "loop.module_zero_grad")
    else:
        assert "clear_site" not in first  # no zero_grad() ran after the backward: the line is not known
    assert result["sites"][first["backward_site"]]["code"] == "loop.backward(loop.loss())"


def test_a_clear_before_the_backward_is_the_ordinary_loop_and_every_step_counts() -> None:
    loop = _loop()
    for _ in range(4):
        loop.optimizer_zero_grad(loop.optimizer)
        loop.backward(loop.loss())
        loop.step()
    assert loop.collect()["ineffective_count"] == 0


def test_a_loss_cut_from_the_parameters_and_a_frozen_optimizer_are_told_apart() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 1))
    cut = _Loop(model, torch.optim.Adam(model[0].parameters(), lr=0.1))  # the optimizer holds the first layer only
    for _ in range(2):
        features = model[0](torch.randn(8, 4)).detach()  # the graph ends here
        cut.optimizer_zero_grad(cut.optimizer)
        cut.backward((model[1](features) ** 2).mean())
        cut.step()
    result = cut.collect()
    first = result["ineffective"][0]
    assert result["ineffective_count"] == 2 and first["cause"] == "no-gradient" and first["grads_after_backward"] == 0

    frozen = _loop()
    for p in frozen.model.parameters():
        p.requires_grad = False
    frozen.step()
    first = frozen.collect()["ineffective"][0]
    assert first["cause"] == "frozen" and first["frozen"] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_a_zero_learning_rate_and_a_step_without_backward_are_their_own_causes() -> None:
    zero = _loop(lr=0.0)
    zero.backward(zero.loss())
    zero.step()
    assert zero.collect()["ineffective"][0]["cause"] == "zero-lr"

    again = _loop()
    again.backward(again.loss())
    again.step()
    again.optimizer_zero_grad(again.optimizer)
    again.step()  # no backward since the previous step
    result = again.collect()
    assert result["ineffective_count"] == 1 and result["ineffective"][0]["cause"] == "no-backward"


def test_parameters_an_ema_update_moves_between_steps_do_not_hide_an_ineffective_step() -> None:
    """The optimizer also holds a target network's frozen parameters, which an EMA update moves
    between its steps: each step is still compared across itself."""
    loop = _loop()
    target = [torch.nn.Parameter(torch.zeros(3), requires_grad=False)]
    loop.optimizer.add_param_group({"params": target})
    for _ in range(5):
        with torch.no_grad():
            target[0].mul_(0.9).add_(1.0)  # the EMA update, between steps
        loop.backward(loop.loss())
        loop.optimizer_zero_grad(loop.optimizer)
        loop.step()
    result = loop.collect()
    assert result["ineffective_count"] == 5 and {r["cause"] for r in result["ineffective"]} == {"cleared"}


def _follow(feeds: LossFeeds, model: Any, key: str, x: Any) -> Any:
    """A no-grad forward of `model` in train mode, watched as the modes probe watches it."""
    with torch.no_grad():
        feeds.watch(model, key)
        return model(x)


def test_a_target_network_feeding_the_loss_is_training_and_an_evaluation_pass_is_not() -> None:
    torch.manual_seed(0)
    online, target = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    verdicts: dict[str, bool] = {}
    feeds = LossFeeds(torch, verdicts.__setitem__)
    x = torch.randn(8, 4)
    targets = _follow(feeds, target, "target", x)
    prediction = torch.nn.functional.normalize(online(x), dim=-1)
    loss = (2 - 2 * (prediction * torch.nn.functional.normalize(targets, dim=-1)).sum(dim=-1)).mean()
    feeds.backward(loss)
    assert verdicts == {"target": True}

    scores = _follow(feeds, online, "evaluation", x)
    accuracy = (scores.argmax(dim=1) == 0).float().mean()
    assert 0 <= float(accuracy) <= 1
    feeds.backward(((online(x) - 1) ** 2).mean())  # the next training step's loss
    assert verdicts == {"target": True, "evaluation": False}

    _follow(feeds, online, "last-evaluation", x)
    feeds.close()  # the run ended: it fed no backward
    assert verdicts["last-evaluation"] is False
    from torch.overrides import _get_current_function_mode_stack

    assert _get_current_function_mode_stack() == []  # the mode is gone once judged


# -- gradient-clipping, loss shapes, functional dropout, data-leakage: the probes' own parts ----------


def _clips(loop: _Loop) -> Any:
    from traingate.stages.correctness.probe.clipping import ClipWatch

    clips = loop.watch.clips = ClipWatch(loop.watch.sites, loop.causes)  # type: ignore[arg-type]
    clips.torch = torch
    return clips


def _clip(clips: Any, model: Any) -> None:
    wrapped = clips._wrap("clip_grad_norm_", torch.nn.utils.clip_grad_norm_)
    wrapped(model.parameters(), max_norm=0.1)


@pytest.mark.parametrize("order", ["clip-then-backward", "backward-clip-backward", "backward-then-clip", "skipped-step"])
def test_a_clip_is_judged_against_the_backward_the_step_applies(order: str) -> None:
    loop = _loop()
    clips = _clips(loop)
    for step in range(3):
        loop.optimizer_zero_grad(loop.optimizer)
        if order == "clip-then-backward":
            _clip(clips, loop.model)
        loop.backward(loop.loss())
        _clip(clips, loop.model) if order != "clip-then-backward" else None
        if order == "backward-clip-backward":
            loop.backward(loop.loss())
        if order == "skipped-step" and step == 0:
            continue  # a GradScaler skipped this step: the next iteration clips again
        loop.step()
    found = loop.collect()["clips"]
    if order in ("backward-then-clip", "skipped-step"):
        assert found == []
    else:
        [record] = found
        assert record["kind"] == ("before-backward" if order == "clip-then-backward" else "backward-after-clip")
        assert record["steps"] == 3 and record["step_indexes"] == [0, 1, 2] and record["function"] == "clip_grad_norm_"
        assert loop.collect()["sites"][record["backward_site"]]["code"] == "loop.backward(loop.loss())"


def _loss_watch() -> Any:
    from traingate.stages.correctness.probe.loss_inputs import LossInputWatch

    watch = LossInputWatch()
    watch.torch = torch
    watch.sites = SiteTable(HERE)
    return watch


@pytest.mark.filterwarnings("ignore")
def test_element_wise_losses_whose_shapes_broadcast_the_input_are_kept_with_both_shapes() -> None:
    watch = _loss_watch()
    prediction = torch.randn(6, 1, requires_grad=True)
    warnings.simplefilter("ignore")  # torch's size warning silenced, as the target may: the shapes are read on the tensors
    for name in ("mse_loss", "l1_loss", "binary_cross_entropy_with_logits"):
        loss = watch._wrap(name, getattr(torch.nn.functional, name))
        if name == "binary_cross_entropy_with_logits":
            with pytest.raises(ValueError):  # torch refuses these shapes itself: nothing to report
                loss(prediction, torch.rand(6))
        else:
            loss(prediction, torch.randn(6))
    watch._wrap("mse_loss", torch.nn.functional.mse_loss)(prediction.squeeze(-1), torch.randn(6))  # same shapes
    watch._wrap("mse_loss", torch.nn.functional.mse_loss)(prediction, torch.zeros(1))  # a constant target: the input is not expanded
    shapes = {s["function"]: s for s in watch.collect()["shapes"]}
    assert set(shapes) == {"mse_loss", "l1_loss"}
    assert (shapes["mse_loss"]["input_shape"], shapes["mse_loss"]["target_shape"], shapes["mse_loss"]["broadcast_shape"]) == ([6, 1], [6], [6, 6])
    assert shapes["mse_loss"]["gradients_recorded"] is True and shapes["mse_loss"]["mismatched"] == 1


def test_a_functional_dropout_at_its_default_is_judged_by_the_calling_module_mode() -> None:
    from traingate.stages.correctness.probe.modes import ModeWatch

    watch = ModeWatch()
    watch.torch = torch
    watch.sites = SiteTable(HERE)
    dropout = watch._dropout("dropout", torch.nn.functional.dropout)

    class Block(torch.nn.Module):
        def __init__(self, follow: bool) -> None:
            super().__init__()
            self.follow = follow

        def forward(self, x: Any) -> Any:
            return dropout(x, 0.3, training=self.training) if self.follow else dropout(x, 0.3)

    x = torch.ones(4, 8)
    Block(follow=False).train()(x)  # train mode: dropout on, as meant
    Block(follow=True).eval()(x)  # follows the mode
    torch.nn.functional.dropout(x, 0.3, True)  # unwrapped call, for symmetry: never recorded
    Block(follow=False).eval()(x)
    [record] = watch.collect()["functional_dropout"]
    assert (record["function"], record["module"], record["calls"], record["p"]) == ("dropout", "Block", 1, 0.3)


def test_evaluation_samples_also_trained_on_are_counted_and_a_train_accuracy_pass_is_not() -> None:
    from traingate.stages.correctness.probe.loaders import LoaderWatch

    watch = LoaderWatch()
    samples = torch.arange(40.0).reshape(20, 2)
    trained, evaluated, train_again = ({"steps": 3, "epochs": 1}, {"steps": 0, "epochs": 1}, {"steps": 0, "epochs": 1})
    watch.loaders = [trained, evaluated, train_again]
    train_set, other = object(), object()
    watch._datasets = {id(trained): id(train_set), id(evaluated): id(other), id(train_again): id(train_set)}
    watch._fingerprint(trained, (samples[:16], torch.zeros(16)))
    watch._fingerprint(evaluated, [samples[10:20]])
    watch._fingerprint(train_again, samples[:16])
    assert watch.overlaps() == [{"trained": 0, "evaluated": 1, "overlap": 6, "evaluated_samples": 10, "trained_samples": 16}]


def test_one_line_calling_two_models_under_no_grad_in_train_mode_is_one_cause() -> None:
    from traingate.stages.correctness.probe.payloads import TrainUnderNoGrad
    from traingate.stages.correctness.modes import _one_per_line

    def record(site: int, root: str, module: str) -> TrainUnderNoGrad:
        return TrainUnderNoGrad.model_validate(
            {"site": site, "root": root, "modules": [{"name": module, "class": "BatchNorm1d", "kind": "norm"}], "first_step": 3, "forwards": 2, "inference_mode": False}
        )

    inner, outer, elsewhere = record(7, "Backbone", "features.1"), record(7, "Sequential", "1"), record(9, "Backbone", "features.1")
    merged, other = _one_per_line([inner, outer, elsewhere])
    assert merged.root == "Backbone, Sequential" and [m.name for m in merged.modules] == ["features.1", "1"] and merged.forwards == 4
    assert other == elsewhere


def test_data_whose_samples_repeat_is_not_judged_for_leakage() -> None:
    """Low-entropy synthetic data (the bundled example's token sequences): equal content in two
    independently generated sets is no evidence that a sample is shared."""
    from traingate.stages.correctness.probe.loaders import LoaderWatch

    watch = LoaderWatch()
    trained, evaluated = {"steps": 3, "epochs": 1}, {"steps": 0, "epochs": 1}
    watch.loaders = [trained, evaluated]
    watch._datasets = {id(trained): 1, id(evaluated): 2}
    rows = torch.tensor([[0.0, 1.0], [2.0, 3.0], [0.0, 1.0], [4.0, 5.0]])  # the first sample twice
    watch._fingerprint(trained, rows)
    watch._fingerprint(evaluated, rows[1:])
    assert watch._repeats[id(trained)] == 1 and watch.overlaps() == []
