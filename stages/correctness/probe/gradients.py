"""Instrument telling, at every optimizer step, how much of the gradient it applied was carried
over from before that optimizer's previous step (stale-gradients).

`Tensor.backward` and `torch.autograd.backward` are wrapped: before each backward call adds
into `.grad`, the L2 norm of the `.grad` of every parameter of each optimizer that has stepped
is taken (None counts as 0). Per optimizer, since its last step: `first` is those norms at the
first backward, `least` the smallest each reached at any backward or at the step itself. A
parameter whose gradient was cleared since the step (`zero_grad()`, `set_to_none`,
`param.grad = None`, `grad.zero_()`) has `least == 0`; one whose gradient never was still
holds, at the step, everything that was there at the previous step (its `first` norm).
Deliberate accumulation (k backward calls, one step, then zero) clears before the next
backward and stays clean. Steps with no backward since the optimizer's previous step are not
judged (a step that reuses the previous gradients entirely is a different defect).

Once every gradient is None at a backward (`zero_grad()`'s default), nothing can be carried
until the next step and no norm is taken. The norms stay on the parameters' device; one small vector a step is kept and read when the
run ends, so the run is not synchronised at every step.

The same wrappers and step hooks feed `probe.clears`: the lines whose `zero_grad()` ran, and
the backward passes a clear threw away before any step used them.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from typing import Any
from collections.abc import Callable

from ...harness.tensors import exact_norm
from .clears import ClearWatch
from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import call_original, guarded

MAX_STEP_RECORDS = 10_000  # steps judged; past it, counted as dropped
# An optimizer still unstepped after this many backward calls is no longer observed (its next
# step is counted as dropped): an idle optimizer would otherwise cost a norm pass per backward.
MAX_BACKWARDS = 256
MAX_LISTED = 200  # stale steps kept in full; the rest are counted


@dataclass
class _Since:
    """One optimizer's gradients since its last step."""

    params: list[Any]
    ids: list[int]
    first: Any = None  # norms at the first backward after the step
    least: Any = None  # the smallest norm each reached since
    backward_site: int | None = None
    cleared: bool = False  # every gradient was None at one backward: nothing can be carried
    backwards: int = 0


@dataclass
class _Judged:
    step: int
    optimizer: int
    site: int | None
    backward_site: int | None
    figures: Any  # device tensor [carried norm^2, applied norm^2, parameters carrying a gradient]; None: all cleared
    params: int


class StaleGradientWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.steps = 0
        self.judged: list[_Judged] = []
        self.dropped = 0
        # Per optimizer, by identity, not id(): an optimizer made after another was freed often
        # gets its id, and would take over its number and its gradients' history.
        self._since: ObjectMap[_Since] = ObjectMap()
        self._optimizer_index: ObjectMap[int] = ObjectMap()
        self._optimizers = 0
        self._tls = threading.local()
        self.clears: ClearWatch | None = None

    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.torch = torch
        self.sites = SiteTable(ctx.root)
        self.clears = ClearWatch(self.sites)
        self.clears.install(torch)
        tensor_backward = torch.Tensor.backward
        autograd_backward = torch.autograd.backward

        @functools.wraps(tensor_backward)
        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            return self._call(tensor_backward, tensor, *args, **kwargs)

        @functools.wraps(autograd_backward)
        def autograd(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            return self._call(autograd_backward, tensors, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]  # patched while the run lasts
        torch.autograd.backward = autograd
        register_optimizer_step_pre_hook(guarded(self._pre))
        register_optimizer_step_post_hook(guarded(self._post))

    # -- the hooks ----------------------------------------------------------------------------------
    def _call(self, original: Callable[..., Any], first: Any, *args: Any, **kwargs: Any) -> Any:
        # Tensor.backward calls torch.autograd.backward: one call, observed once.
        if getattr(self._tls, "inside", False):
            return call_original(original, first, *args, **kwargs)
        self._before_backward()
        if self.clears is not None:
            self.clears.backward()
        self._tls.inside = True
        try:
            return call_original(original, first, *args, **kwargs)
        finally:
            self._tls.inside = False

    def _before_backward(self) -> None:
        for since in self._since.values():
            since.backwards += 1
            if since.cleared or since.backwards > MAX_BACKWARDS:
                continue
            if since.backwards == 1:
                assert self.sites is not None
                since.backward_site = self.sites.innermost(3)
            if all(p.grad is None for p in since.params):  # `zero_grad()`'s default: no norm to take
                since.cleared = True
                continue
            norms = self._norms(since.params)
            if since.first is None:
                since.first, since.least = norms, norms
            else:
                since.least = self.torch.minimum(since.least, norms)

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.clears is not None:
            self.clears.step_started()

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        assert self.sites is not None
        if self.clears is not None:
            self.clears.step_ended(optimizer)
        index = self.steps
        self.steps += 1
        number = self._optimizer_index.get(optimizer)
        if number is None:
            number = self._optimizer_index[optimizer] = self._optimizers
            self._optimizers += 1
        params = [p for group in optimizer.param_groups for p in group["params"]]
        ids = [id(p) for p in params]  # stable: `_Since.params` holds the parameters
        since = self._since.get(optimizer)
        if since is not None and since.backwards and since.ids == ids and params:
            self._judge(index, number, since)
        self._since[optimizer] = _Since(params=params, ids=ids)

    def _judge(self, index: int, optimizer: int, since: _Since) -> None:
        assert self.sites is not None
        if len(self.judged) >= MAX_STEP_RECORDS or (since.backwards > MAX_BACKWARDS and not since.cleared):
            self.dropped += 1
            return
        if since.cleared:
            self.judged.append(_Judged(index, optimizer, None, since.backward_site, None, len(since.params)))
            return
        torch = self.torch
        with torch.no_grad():
            applied = self._norms(since.params)
            carrying = (torch.minimum(since.least, applied) > 0) & (since.first > 0)
            carried = torch.where(carrying, since.first, torch.zeros_like(since.first))
            figures = torch.stack((carried.square().sum(), applied.square().sum(), carrying.sum().to(applied.dtype)))
        self.judged.append(_Judged(index, optimizer, self.sites.innermost(1), since.backward_site, figures, len(since.params)))

    def _norms(self, params: list[Any]) -> Any:
        """The L2 norm of each parameter's gradient (0 for None), on the first parameter's
        device: one fused norm per (device, dtype) of dense real gradients, one call each for
        the others (sparse, complex)."""
        torch = self.torch
        device = params[0].device
        dtype = torch.float64 if any(p.dtype in (torch.float64, torch.complex128) for p in params) else torch.float32
        out = torch.zeros(len(params), device=device, dtype=dtype)
        groups: dict[tuple[Any, Any], list[int]] = {}
        with torch.no_grad():
            for i, p in enumerate(params):
                grad = p.grad
                if grad is None:
                    continue
                if grad.is_sparse or not grad.is_floating_point():
                    out[i] = _grad_norm(torch, grad).to(device=device, dtype=dtype)
                else:
                    groups.setdefault((grad.device, grad.dtype), []).append(i)
            for (_, grad_dtype), indexes in groups.items():
                exact = torch.float64 if grad_dtype == torch.float64 else torch.float32
                norms = torch._foreach_norm([params[i].grad for i in indexes], 2, dtype=exact)
                out[torch.tensor(indexes, device=device)] = torch.stack(norms).to(device=device, dtype=dtype)
        return out

    # -- the result ----------------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        from .payloads import GradientsPayload  # at collect(): no start-up cost

        assert self.sites is not None
        stale: list[dict[str, Any]] = []
        count, most = 0, 0.0
        for judged in self.judged:
            if judged.figures is None:
                continue
            carried2, applied2, carrying = (float(v) for v in judged.figures.detach().cpu().tolist())
            if carrying <= 0:
                continue
            count += 1
            share = math.sqrt(carried2 / applied2) if applied2 > 0 and math.isfinite(carried2 / applied2) else None
            most = max(most, share or 0.0)
            if len(stale) < MAX_LISTED:
                stale.append(
                    {
                        "step": judged.step,
                        "optimizer": judged.optimizer,
                        "site": judged.site,
                        "backward_site": judged.backward_site,
                        "carried_norm": _finite_or_none(math.sqrt(carried2)),
                        "applied_norm": _finite_or_none(math.sqrt(applied2)),
                        "carried_share": share,
                        "params_carrying": int(carrying),
                        "params": judged.params,
                    }
                )
        return GradientsPayload.sent({
            "steps": self.steps,
            "judged": len(self.judged),
            "dropped": self.dropped,
            "stale": stale,
            "stale_count": count,
            "largest_share": most,
            "sites": self.sites.sites,
            **(self.clears.collect() if self.clears is not None else {}),
        })


def _grad_norm(torch: Any, grad: Any) -> Any:
    """A gradient's L2 norm in its exact dtype; a sparse one over its coalesced values."""
    if grad.is_sparse:
        grad = grad.coalesce().values()
    return exact_norm(torch, grad)


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None
