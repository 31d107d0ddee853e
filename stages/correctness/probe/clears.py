"""The clearing calls of a run, for the gradients watch (`probe.gradients`): which lines of
the target cleared gradients and how often, and the backward passes whose gradients a clear
threw away before any optimizer step used them.

`Optimizer.zero_grad` and `Module.zero_grad` are wrapped. Each call is counted at its line
(stale-gradients names a clearing call that exists in the source and never ran). A call made
outside an optimizer step (a closure's `zero_grad()` inside `step(closure)` is the step's
own) after backward calls that reached the cleared parameters, with no optimizer step since
the latest of them, discards those backward passes. A step's decision on the gradients counts
as a step: `GradScaler.step` (which may skip the optimizer's on an overflow), and
`GradScaler.unscale_` or a gradient clipping call (what precedes a step skipped by hand on a
non-finite norm). Which parameters a backward reached is told by their `.grad`: a gradient
tensor other than the one there after the latest step or clear of that parameter, or the same
one with a later version (autograd accumulates into it in place), was written since. The
discard is only provisional until the next step: it stands when that step applies gradients
from backward calls made after the latest clear (`zero_grad()` at every
micro-batch of an accumulation loop); it is dropped when no backward came between the clear
and the step, where the cleared gradients were either copied by hand into `.grad` (per-sample
clipping) or never replaced (the step then changed nothing: ineffective-step's cause).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import call_original

MAX_DISCARD_SITES = 50


@dataclass
class _Pending:
    site: int | None
    call: str
    discarded: int  # backward calls whose gradients the clear dropped


class ClearWatch:
    def __init__(self, sites: SiteTable) -> None:
        self.sites = sites
        self.backwards = 0
        self.clear_calls: dict[int | None, int] = {}  # site -> zero_grad() calls made there
        self.discards: dict[int | None, dict[str, Any]] = {}  # site -> {"call", "backwards", "clears"}
        self._step_depth = 0
        self._at_step = 0  # backward calls made before the latest step
        self._cleared_at: ObjectMap[int] = ObjectMap()  # owner -> backward calls before its latest clear
        # id(parameter) -> (id(.grad), its version) after the parameter's latest step or clear; the
        # optimizers and modules, which the run keeps, keep the parameters and their ids.
        self._marks: dict[int, tuple[int, int]] = {}
        self._pending: list[_Pending] = []
        self._last_clear = 0  # backward calls made before the latest clear outside a step

    def install(self, torch: Any) -> None:
        self.torch = torch
        torch.optim.Optimizer.zero_grad = self._clearing(torch.optim.Optimizer.zero_grad, "Optimizer.zero_grad", _optimizer_params)
        torch.nn.Module.zero_grad = self._clearing(torch.nn.Module.zero_grad, "Module.zero_grad", _module_params)
        scaler = getattr(getattr(torch, "amp", None), "GradScaler", None)
        if scaler is not None:
            scaler.step = self._scaler_step(scaler.step)
            scaler.unscale_ = self._inspecting(scaler.unscale_)
        import torch.nn.utils.clip_grad as clip_grad

        for name in ("clip_grad_norm_", "clip_grad_value_"):
            wrapped = self._inspecting(getattr(clip_grad, name))
            for module in (torch.nn.utils, clip_grad):
                setattr(module, name, wrapped)

    # -- events -----------------------------------------------------------------------------------
    def backward(self) -> None:
        self.backwards += 1

    def step_started(self) -> None:
        self._step_depth += 1

    def step_ended(self, optimizer: Any) -> None:
        self._step_depth = max(0, self._step_depth - 1)
        self._mark(_optimizer_params(optimizer))
        if self._step_depth == 0:
            self._stepped()

    def _mark(self, params: list[Any]) -> None:
        marks = self._marks
        for p in params:
            grad = p.grad
            if grad is None:
                marks.pop(id(p), None)
            else:
                marks[id(p)] = (id(grad), grad._version)

    def _stepped(self) -> None:
        """A step used the gradients there: settle the clears since the previous step."""
        # The step's gradients came from backward calls after the latest clear: what the clears
        # before dropped was lost. None after it: the cleared gradients went somewhere by hand.
        used = self.backwards > self._last_clear
        for pending in self._pending if used else []:
            record = self.discards.get(pending.site)
            if record is None:
                if len(self.discards) >= MAX_DISCARD_SITES:
                    continue
                record = self.discards[pending.site] = {"call": pending.call, "backwards": 0, "clears": 0}
            record["backwards"] += pending.discarded
            record["clears"] += 1
        self._pending = []
        self._at_step = self.backwards

    def _scaler_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def step(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            watch._step_depth += 1
            try:
                return call_original(original, scaler, *args, **kwargs)
            finally:
                watch.step_ended(args[0] if args else kwargs.get("optimizer"))  # a step it skipped (inf or NaN found) is a decision on these gradients too

        return step

    def _inspecting(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """A call that reads the gradients on the way to a step: what it read was used."""
        watch = self

        @functools.wraps(original)
        def inspect(*args: Any, **kwargs: Any) -> Any:
            if watch._step_depth == 0:
                watch._pending = []
                watch._at_step = watch.backwards
            return call_original(original, *args, **kwargs)

        return inspect

    def _clearing(self, original: Callable[..., Any], call: str, params_of: Callable[[Any], list[Any]]) -> Callable[..., Any]:
        watch = self

        @functools.wraps(original)
        def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> Any:
            site = watch.sites.innermost(1)
            watch.clear_calls[site] = watch.clear_calls.get(site, 0) + 1
            if watch._step_depth == 0:
                watch._cleared(owner, site, call, params_of)
                watch._last_clear = watch.backwards
            result = call_original(original, owner, *args, **kwargs)
            watch._cleared_at[owner] = watch.backwards
            watch._mark(params_of(owner))
            return result

        return zero_grad

    def _cleared(self, owner: Any, site: int | None, call: str, params_of: Callable[[Any], list[Any]]) -> None:
        since = self.backwards - max(self._at_step, self._cleared_at.get(owner, 0))
        if since <= 0:
            return
        if not self._reached(params_of(owner)):
            return
        self._pending.append(_Pending(site, call, since))

    def _reached(self, params: list[Any]) -> bool:
        """Whether a backward wrote into one of `params`' gradients since its latest step or clear."""
        marks = self._marks
        for p in params:
            grad = p.grad
            if grad is not None and marks.get(id(p)) != (id(grad), grad._version):
                return True
        return False

    # -- the result ----------------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        return {
            "backward_calls": self.backwards,
            "clear_sites": [{"site": site, "calls": calls} for site, calls in self.clear_calls.items()],
            "discarded": [{"site": site, **record} for site, record in self.discards.items()],
        }


def _optimizer_params(optimizer: Any) -> list[Any]:
    return [p for group in getattr(optimizer, "param_groups", []) for p in group["params"]]


def _module_params(module: Any) -> list[Any]:
    return list(module.parameters())
