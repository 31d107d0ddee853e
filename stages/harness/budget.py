"""The step budget: the training's own defaults, made short by the gate.

`max_batches` ends every DataLoader iteration after that many batches (the loop over the
loader sees `StopIteration`, as at the end of an epoch, so epochs are short and evaluation
loops still run); `max_steps` ends the run after that many optimizer steps: the step's
post-hooks (the probes' included, installed before) run, then `StepBudgetReached` unwinds the
target's stack. It derives from BaseException so that the target's `except Exception` does
not swallow it; a target that swallows it anyway gets it again at its next step. The harness
counts the run as ended normally only when the exception that escaped is the one raised
here (`BudgetStop.is_ours`), so the target cannot end a crashed run by raising it itself.
"""

from __future__ import annotations

from typing import Any


class StepBudgetReached(BaseException):
    """The run reached its `max_steps`: a controlled stop, not a crash."""


class BudgetStop:
    """The budget installed in this process, and what it did."""

    def __init__(self, max_batches: int | None, max_steps: int | None) -> None:
        self.max_batches = max_batches
        self.max_steps = max_steps
        self.steps_by_optimizer: dict[int, int] = {}
        self.iterations_cut = 0
        self.raised: StepBudgetReached | None = None

    @property
    def steps(self) -> int:
        return max(self.steps_by_optimizer.values(), default=0)

    def is_ours(self, exc: BaseException) -> bool:
        return self.raised is not None and exc is self.raised

    def record(self) -> dict[str, Any]:
        """The fields of the result's `BudgetRecord`."""
        return {
            "max_batches": self.max_batches,
            "max_steps": self.max_steps,
            "steps": self.steps,
            "stopped_at_steps": self.raised is not None,
            "iterations_cut": self.iterations_cut,
        }

    def _before_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.raised is not None:  # the target swallowed the stop and stepped again
            raise self.raised

    def _after_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        key = id(optimizer)
        self.steps_by_optimizer[key] = self.steps_by_optimizer.get(key, 0) + 1
        if self.max_steps is not None and self.steps_by_optimizer[key] >= self.max_steps:
            self.raised = StepBudgetReached(f"the step budget: {self.max_steps} optimizer steps")
            raise self.raised


def install(max_batches: int | None, max_steps: int | None) -> BudgetStop | None:
    """Install the budget (after the instruments, so their step hooks run first); None without one."""
    if max_batches is None and max_steps is None:
        return None
    budget = BudgetStop(max_batches, max_steps)
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(budget._before_step)
    register_optimizer_step_post_hook(budget._after_step)
    if max_batches is not None:
        _cut_loader_iterations(budget, max_batches)
    return budget


def _cut_loader_iterations(budget: BudgetStop, limit: int) -> None:
    """Every DataLoader iterator (single- or multi-process, persistent or not) counts what it
    yielded since its last reset in `_num_yielded`: past `limit`, it ends as an epoch ends."""
    from torch.utils.data import dataloader

    base = dataloader._BaseDataLoaderIter
    original = base.__next__

    def __next__(self: Any) -> Any:
        if self._num_yielded >= limit:
            if getattr(self, "_budget_cut_at", None) != id(self._sampler_iter):
                self._budget_cut_at = id(self._sampler_iter)  # once per epoch of this iterator
                budget.iterations_cut += 1
            raise StopIteration
        return original(self)

    base.__next__ = __next__  # type: ignore[method-assign]
