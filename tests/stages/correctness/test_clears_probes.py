"""The clear watch (`probe.clears`) on the patterns that discard backward passes and those that
do not, its wrappers called directly (installing them would patch this process's torch); and
the source reading that finds a `zero_grad()` that never ran and the branch above it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from traingate.stages.harness.sites import SiteTable  # noqa: E402
from traingate.stages.correctness.probe.clears import ClearWatch, _module_params, _optimizer_params  # noqa: E402
from traingate.stages.correctness.skipped_clears import skipped_clears  # noqa: E402

HERE = Path(__file__).parent


class _Run:
    """A ClearWatch with its zero_grad wrappers, and the events its hooks would see."""

    def __init__(self) -> None:
        self.watch = ClearWatch(SiteTable(HERE))
        self.watch.torch = torch
        self.zero = self.watch._clearing(torch.optim.Optimizer.zero_grad, "Optimizer.zero_grad", _optimizer_params)
        self.zero_module = self.watch._clearing(torch.nn.Module.zero_grad, "Module.zero_grad", _module_params)

    def backward(self, loss: Any) -> None:
        self.watch.backward()
        loss.backward()

    def step(self, optimizer: Any, closure: Any = None) -> None:
        self.watch.step_started()
        optimizer.step(closure) if closure is not None else optimizer.step()
        self.watch.step_ended(optimizer)

    def discarded(self) -> int:
        return sum(d["backwards"] for d in self.watch.collect()["discarded"])


def _model() -> tuple[Any, Any, Any]:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1), torch.randn(8, 4), torch.randn(8, 1)


def _loss(model: Any, x: Any, y: Any) -> Any:
    return ((model(x) - y) ** 2).mean()


@pytest.mark.parametrize("set_to_none", [True, False])
def test_a_clear_at_every_micro_batch_discards_all_but_the_last(set_to_none: bool) -> None:
    model, x, y = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = _Run()
    for index in range(12):
        run.zero(optimizer, set_to_none=set_to_none)
        run.backward(_loss(model, x, y))
        if index % 4 == 3:
            run.step(optimizer)
    [record] = run.watch.collect()["discarded"]
    assert record["backwards"] == 9 and record["clears"] == 9 and record["call"] == "Optimizer.zero_grad"


@pytest.mark.parametrize("set_to_none", [True, False])
def test_accumulation_cleared_after_the_step_discards_nothing(set_to_none: bool) -> None:
    model, x, y = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = _Run()
    for index in range(12):
        run.backward(_loss(model, x, y))
        if index % 4 == 3:
            run.step(optimizer)
            run.zero(optimizer, set_to_none=set_to_none)
    assert run.discarded() == 0 and run.watch.collect()["backward_calls"] == 12


def test_a_clear_between_backward_and_step_is_left_to_ineffective_step() -> None:
    model, x, y = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = _Run()
    for _ in range(4):
        run.backward(_loss(model, x, y))
        run.zero_module(model)
        run.step(optimizer)
    assert run.discarded() == 0


def test_a_gan_whose_generator_loss_reaches_the_discriminator_discards_nothing() -> None:
    generator, x, _ = _model()
    discriminator = torch.nn.Linear(1, 1)
    g_opt, d_opt = torch.optim.SGD(generator.parameters(), lr=0.1), torch.optim.SGD(discriminator.parameters(), lr=0.1)
    run = _Run()
    for _ in range(4):
        run.zero(d_opt)
        run.backward(discriminator(generator(x).detach()).mean())
        run.step(d_opt)
        run.zero(g_opt)
        run.backward(discriminator(generator(x)).mean())
        run.step(g_opt)
    assert run.discarded() == 0


def test_two_models_cleared_before_their_own_backward_discard_nothing() -> None:
    """A's backward runs before B is cleared, but never reached B's parameters."""
    a, x, y = _model()
    b = torch.nn.Linear(4, 1)
    a_opt, b_opt = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    run = _Run()
    for _ in range(4):
        run.zero(a_opt)
        run.backward(_loss(a, x, y))
        run.zero(b_opt)
        run.backward(_loss(b, x, y))
        run.step(a_opt)
        run.step(b_opt)
    assert run.discarded() == 0


def test_a_closure_clearing_inside_the_step_discards_nothing() -> None:
    model, x, y = _model()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=4)
    run = _Run()

    def closure() -> Any:
        run.zero(optimizer)
        loss = _loss(model, x, y)
        run.backward(loss)
        return loss

    for _ in range(3):
        run.step(optimizer, closure)
    assert run.discarded() == 0


def test_per_sample_gradients_copied_by_hand_before_the_clear_discard_nothing() -> None:
    """Per-sample clipping: each sample's gradient is read, cleared, and the clipped sum is
    written into `.grad` by hand before the step (no backward between the last clear and it)."""
    model, x, y = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = _Run()
    for _ in range(3):
        summed = [torch.zeros_like(p) for p in model.parameters()]
        for i in range(4):
            run.backward(_loss(model, x[i : i + 1], y[i : i + 1]))
            for total, p in zip(summed, model.parameters(), strict=True):
                total += p.grad.clamp(-1, 1)
            run.zero(optimizer)
        for total, p in zip(summed, model.parameters(), strict=True):
            p.grad = total / 4
        run.step(optimizer)
        run.zero(optimizer)
    assert run.discarded() == 0


SOURCE = '''
class Trainer:
    def step(self, loss):
        loss.backward()
        self.optimizer.step()
        if self.scheduler:
            self.scheduler.step()
            self.optimizer.zero_grad()
        if self.log:
            pass
        else:
            self.model.zero_grad()
        try:
            self.optimizer.zero_grad(set_to_none=True)
        except RuntimeError:
            self.model.zero_grad()

    def unrelated(self):
        self.optimizer.zero_grad()
'''


def test_the_clears_that_never_ran_are_named_with_their_branch(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(SOURCE)
    found = skipped_clears(tmp_path, [("train.py", 5)], {("train.py", 14): 8}, 8)
    assert [(c.line, c.branch_line, c.branch_arm) for c in found] == [(8, 6, "body"), (12, 9, "else"), (16, 15, "handler")]
    assert found[0].code == "self.optimizer.zero_grad()" and found[0].branch_code == "if self.scheduler:" and found[0].function == "step"
    assert "under `if self.scheduler:` (line 6)" in found[0].describe()
    # Another method's clear is not this loop's; a clear that ran is not named.
    assert all(c.function == "step" for c in found)
    assert skipped_clears(tmp_path, [("train.py", 5)], {("train.py", n): 8 for n in (8, 12, 14, 16)}, 8) == []


def test_a_step_a_grad_scaler_skipped_on_inf_discards_nothing() -> None:
    """The scaler looked at the gradients and skipped the step on purpose: a decision, not a loss."""
    model, x, y = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    run = _Run()
    scaler_step = run.watch._scaler_step(torch.amp.GradScaler.step)
    for index in range(4):
        run.zero(optimizer)
        loss = _loss(model, x, y) * (float("inf") if index < 2 else 1.0)
        run.backward(scaler.scale(loss))
        scaler_step(scaler, optimizer)
        scaler.update()
    assert run.discarded() == 0 and run.watch.collect()["backward_calls"] == 4


def test_a_step_skipped_by_hand_after_clipping_found_a_non_finite_norm_discards_nothing() -> None:
    model, x, y = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = _Run()
    clip = run.watch._inspecting(torch.nn.utils.clip_grad_norm_)
    for index in range(4):
        run.zero(optimizer)
        for micro in range(2):
            run.backward(_loss(model, x, y) * (float("inf") if index == 1 and micro == 0 else 1.0))
        if torch.isfinite(clip(model.parameters(), 1.0)):
            run.step(optimizer)
    assert run.discarded() == 0


# Two clears in the stepping function (the shape of tez's `train_one_step`): one at the top that
# runs on an epoch's first batch, one nested under the scheduler's branch after the step, which
# never runs without a scheduler. Lines: step 9, backward 7, the clears 5 and 13.
TWO_CLEARS = '''
class Model:
    def train_one_step(self, data):
        if self.accumulation_steps == 1 and self.batch_index == 0:
            self.zero_grad()
        loss = self.loss(data)
        loss.backward()
        if (self.batch_index + 1) % self.accumulation_steps == 0:
            self.optimizer.step()
            if self.scheduler:
                self.scheduler.step()
                if self.batch_index > 0:
                    self.zero_grad()
        return loss
'''


def test_among_several_clears_the_one_beside_the_step_is_the_cause_with_the_branch_that_skipped_it(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TWO_CLEARS)
    where = [("train.py", 9), ("train.py", 7)]
    # The top clear ran once an epoch (4 of 24 steps); the nested one never.
    first, second = skipped_clears(tmp_path, where, {("train.py", 5): 4}, 24)
    assert (first.line, first.calls, first.branch_line, first.branch_code) == (13, 0, 10, "if self.scheduler:")
    assert "whose condition was false at every step" in first.describe()
    assert (second.line, second.calls, second.branch_line) == (5, 4, 4)
    assert "ran 4 time(s) in 24 optimizer step(s)" in second.describe()
    # Neither ran (accumulation configured): still the one beside the step, named by the outer branch.
    first, second = skipped_clears(tmp_path, where, {}, 24)
    assert (first.line, first.branch_line, second.line, second.branch_line) == (13, 10, 5, 4)
    # A clear that ran at every step is no cause.
    assert [c.line for c in skipped_clears(tmp_path, where, {("train.py", 13): 24, ("train.py", 5): 1}, 24)] == [5]


ONCE_BEFORE = '''
def train(model, optimizer, batches):
    optimizer.zero_grad()
    for x in batches:
        model(x).sum().backward()
        optimizer.step()
'''


def test_a_clear_that_ran_once_before_the_stepping_loop_is_no_cause(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(ONCE_BEFORE)
    assert skipped_clears(tmp_path, [("train.py", 6), ("train.py", 5)], {("train.py", 3): 1}, 8) == []
