"""Why an optimizer step changed nothing, as the step watch (`probe.steps`) sees it happen.

Wrapped while the run lasts: `Tensor.backward` and `torch.autograd.backward` (the latest
backward's line, and how many parameters of each optimizer held a gradient once it returned),
`Optimizer.zero_grad` and `Module.zero_grad` (the latest clearing call: its line, and the
optimizer or module it cleared), `Optimizer.__init__` (the optimizers to count gradients of)
and `LRScheduler.step` (each scheduler's latest step line). At an ineffective step,
`cause()` states the first of these that explains it:

- `frozen`: every parameter the optimizer holds has requires_grad False;
- `zero-lr`: the learning rate of every group was 0;
- `cleared`: the gradients were there after the latest backward and gone (or zero) at the
  step; the clearing call is named when it was a `zero_grad()` over these parameters;
- `no-gradient`: the backward since the previous step left every parameter without a
  gradient: the loss does not reach them;
- `no-backward`: no backward ran since the optimizer's previous step;
- `unexplained`: gradients were present and the rate was not 0, yet nothing moved.
"""

from __future__ import annotations

import functools
import threading
import weakref
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import call_original

MAX_NAMED_FROZEN = 8


@dataclass
class _Clear:
    site: int | None
    call: str  # "Optimizer.zero_grad" or "Module.zero_grad"
    cleared: Any  # weakref to the optimizer or module cleared
    backwards: int  # backward calls made before it


class StepCauses:
    def __init__(self, sites: SiteTable) -> None:
        self.sites = sites
        self.backwards = 0
        self.backward_site: int | None = None
        self._clear: _Clear | None = None
        self._made: list[Any] = []  # weakrefs to every optimizer built
        self._after_backward: ObjectMap[int] = ObjectMap()  # optimizer -> parameters with a gradient after the latest backward
        self._at_step: ObjectMap[int] = ObjectMap()  # optimizer -> backward calls before its latest step
        self.scheduler_steps: ObjectMap[int | None] = ObjectMap()  # scheduler -> its latest step() line
        self._tls = threading.local()

    def install(self, torch: Any) -> None:
        self.torch = torch
        tensor_backward, autograd_backward = torch.Tensor.backward, torch.autograd.backward
        torch.Tensor.backward = self._backward(tensor_backward)
        torch.autograd.backward = self._backward(autograd_backward)
        torch.optim.Optimizer.zero_grad = self._clearing(torch.optim.Optimizer.zero_grad, "Optimizer.zero_grad")
        torch.nn.Module.zero_grad = self._clearing(torch.nn.Module.zero_grad, "Module.zero_grad")
        optimizer_init = torch.optim.Optimizer.__init__

        @functools.wraps(optimizer_init)
        def made(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            optimizer_init(optimizer, *args, **kwargs)
            self._made.append(weakref.ref(optimizer))

        torch.optim.Optimizer.__init__ = made
        scheduler_step = torch.optim.lr_scheduler.LRScheduler.step

        @functools.wraps(scheduler_step)
        def stepped(scheduler: Any, *args: Any, **kwargs: Any) -> Any:
            self.scheduler_steps[scheduler] = self.sites.innermost(1)
            return scheduler_step(scheduler, *args, **kwargs)

        torch.optim.lr_scheduler.LRScheduler.step = stepped

    # -- the wrappers -------------------------------------------------------------------------------
    def _backward(self, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def backward(*args: Any, **kwargs: Any) -> Any:
            if getattr(self._tls, "inside", False):  # Tensor.backward calls torch.autograd.backward
                return call_original(original, *args, **kwargs)
            site = self.sites.innermost(1)
            self._tls.inside = True
            try:
                result = call_original(original, *args, **kwargs)
            finally:
                self._tls.inside = False
            self.backwards += 1
            self.backward_site = site
            self._count_gradients()
            return result

        return backward

    def _clearing(self, original: Callable[..., Any], call: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def zero_grad(owner: Any, *args: Any, **kwargs: Any) -> Any:
            self._clear = _Clear(self.sites.innermost(1), call, _ref(owner), self.backwards)
            return call_original(original, owner, *args, **kwargs)

        return zero_grad

    def _count_gradients(self) -> None:
        live = [ref for ref in self._made if ref() is not None]
        self._made = live
        for ref in live:
            optimizer = ref()
            self._after_backward[optimizer] = sum(1 for group in optimizer.param_groups for p in group["params"] if p.grad is not None)

    # -- at the step ----------------------------------------------------------------------------------
    def stepped(self, optimizer: Any) -> None:
        self._at_step[optimizer] = self.backwards

    def cause(self, optimizer: Any, params: list[Any], lrs: list[float | None], previous_backwards: int) -> dict[str, Any]:
        """Why this ineffective step changed nothing; `previous_backwards`: backward calls made
        before the optimizer's previous step (read before `stepped`)."""
        frozen = [p for p in params if not p.requires_grad]
        if params and len(frozen) == len(params):
            return {"cause": "frozen", "frozen_ids": [id(p) for p in frozen[:MAX_NAMED_FROZEN]]}
        if lrs and all(lr == 0 for lr in lrs if lr is not None) and any(lr is not None for lr in lrs):
            return {"cause": "zero-lr"}
        with self.torch.no_grad():
            applied = sum(1 for p in params if p.grad is not None and bool(p.grad.count_nonzero() if not p.grad.is_sparse else p.grad._nnz()))
        if applied:
            return {"cause": "unexplained"}
        if self.backwards == previous_backwards:
            return {"cause": "no-backward"}
        found = {"backward_site": self.backward_site, "grads_after_backward": self._after_backward.get(optimizer)}
        clear = self._clear
        if clear is not None and clear.backwards == self.backwards and self._covers(clear, params):
            return {"cause": "cleared", **found, "clear_site": clear.site, "clear_call": clear.call}
        if found["grads_after_backward"]:
            return {"cause": "cleared", **found}
        return {"cause": "no-gradient", **found}

    def previous_backwards(self, optimizer: Any) -> int:
        return int(self._at_step.get(optimizer, 0))

    def _covers(self, clear: _Clear, params: list[Any]) -> bool:
        cleared = clear.cleared()
        if cleared is None:
            return False
        if clear.call == "Optimizer.zero_grad":
            held = {id(p) for group in cleared.param_groups for p in group["params"]}
        else:
            held = {id(p) for p in cleared.parameters()}
        return any(id(p) in held for p in params)


def _ref(owner: Any) -> Any:
    try:
        return weakref.ref(owner)
    except TypeError:
        return lambda: owner
