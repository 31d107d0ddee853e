"""Instruments recording the GradScaler protocol and the loss at each optimizer step.

`ProtocolTrace` records, in call order, every `scale`, `backward`, `unscale_`, gradient
clipping, `scaler.step`, `optimizer.step`, `update` and `zero_grad`, each with the innermost
frame of the target that made it, plus the loss per optimizer step. `LossTrace` records only
the loss per optimizer step and the parameters' fingerprints after it (probe/params.py): what
the rerun that checks determinism compares.

Neither changes numerics: they wrap calls and keep a copy of the loss at each step, read only
after the entrypoint returned (reading it at each step would synchronise a GPU, and hide the
races the non_blocking watch looks for), so the protocol run doubles as the first determinism
run.
"""

from __future__ import annotations

import functools
import threading
import weakref
from typing import Any
from collections.abc import Callable

from .params import ParamFingerprints
from ...harness.tensors import exact_sum
from ...harness.sites import SiteTable
from ...harness.identity import ObjectMap
from ...harness.faults import call_original, guarded

MAX_EVENTS = 50_000
MAX_STEPS = 20_000
SCALER_TAG = "_scaled_by_watched_scaler"
_CLIP_FUNCTIONS = ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm")


def _loss_value(tensor: Any) -> float | str:
    """The exact value backward was called on (its sum when it was not a scalar)."""
    try:
        return float(tensor.item())
    except Exception as exc:  # noqa: BLE001 - a recorder never breaks the target
        return f"unreadable: {type(exc).__name__}"


class LossTrace:
    """Loss per optimizer step: the tensors backward ran on since the previous step."""

    def __init__(self) -> None:
        self._pending: list[Any] = []
        self.losses: list[list[Any]] = []  # tensors until collect() reads them
        self.steps = 0
        self._tls = threading.local()
        self.sites: SiteTable | None = None
        self.params = ParamFingerprints()

    # -- installation ---------------------------------------------------------------------
    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self._torch = torch
        self.sites = SiteTable(ctx.root)
        self._wrap_backward(torch)
        register_optimizer_step_pre_hook(guarded(self._on_step))
        self.params.install()

    def _wrap_backward(self, torch: Any) -> None:
        tensor_backward = torch.Tensor.backward
        autograd_backward = torch.autograd.backward

        @functools.wraps(tensor_backward)
        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            return self._backward_call(tensor_backward, [tensor], tensor, *args, **kwargs)

        @functools.wraps(autograd_backward)
        def autograd(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            listed = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
            return self._backward_call(autograd_backward, listed, listed, *args, **kwargs)

        torch.Tensor.backward = backward
        torch.autograd.backward = autograd

    def _backward_call(self, original: Callable[..., Any], tensors: list[Any], first: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self._tls, "in_backward", False):
            return call_original(original, first, *args, **kwargs)
        self._on_backward(tensors)
        self._tls.in_backward = True
        try:
            return call_original(original, first, *args, **kwargs)
        finally:
            self._tls.in_backward = False

    # -- events -----------------------------------------------------------------------------
    def _on_backward(self, tensors: list[Any]) -> None:
        # A scalar is copied; a larger tensor is reduced to its sum (no synchronisation either way).
        # Summed in the loss's own precision (a float64 loss through float32 could overflow to inf).
        self._pending.extend(t.detach().clone() if t.numel() == 1 else exact_sum(self._torch, t.detach().real) for t in tensors)

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if len(self.losses) < MAX_STEPS:
            self.losses.append(self._pending)
        self._pending = []

    def collect(self) -> dict[str, Any]:
        from .payloads import LossTracePayload  # at collect(): no start-up cost

        return LossTracePayload.sent(self._record())

    def _record(self) -> dict[str, Any]:
        losses = [[_loss_value(t) for t in step] for step in self.losses]
        return {"losses": losses, "steps": self.steps, "truncated": self.steps > len(self.losses), "params": self.params.collect()}


class ProtocolTrace(LossTrace):
    """Every call of the GradScaler protocol, in order, with the target's calling line."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[dict[str, Any]] = []
        self.dropped = 0
        self._optimizers: list[weakref.ref[Any]] = []
        # By identity, not id(): a scaler or optimizer made after another was freed often gets its id.
        self._optimizer_ids: ObjectMap[int] = ObjectMap()
        self._scaler_ids: ObjectMap[int] = ObjectMap()
        self._scalers: list[dict[str, Any]] = []
        self._scale_pending: int | None = None

    def install(self, ctx: Any) -> None:
        import torch

        super().install(ctx)
        self._wrap_scaler(torch.amp.GradScaler)
        self._wrap_optimizer(torch.optim.Optimizer)
        self._wrap_clipping(torch)
        self._wrap_module_zero_grad(torch.nn.Module)
        self._wrap_autograd_grad(torch)

    def _event(self, op: str, **data: Any) -> dict[str, Any]:
        assert self.sites is not None
        event = {"op": op, "site": self.sites.innermost(), **data}
        if len(self.events) < MAX_EVENTS:
            self.events.append(event)
        else:
            self.dropped += 1
        return event

    def _optimizer_index(self, optimizer: Any) -> int:
        index = self._optimizer_ids.get(optimizer)
        if index is None:
            index = self._optimizer_ids[optimizer] = len(self._optimizers)
            self._optimizers.append(weakref.ref(optimizer))
        return index

    def _scaler_index(self, scaler: Any) -> int:
        index = self._scaler_ids.get(scaler)
        if index is None:
            index = self._scaler_ids[scaler] = len(self._scalers)
            self._scalers.append({"index": index, "type": type(scaler).__name__, "enabled": bool(scaler.is_enabled())})
        return index

    # -- GradScaler ---------------------------------------------------------------------------
    def _wrap_scaler(self, cls: Any) -> None:
        recorder = self
        scale, unscale, step, update = cls.scale, cls.unscale_, cls.step, cls.update

        @functools.wraps(scale)
        def scale_(scaler: Any, outputs: Any) -> Any:
            index = recorder._scaler_index(scaler)
            recorder._event("scale", scaler=index, enabled=bool(scaler.is_enabled()))
            result = scale(scaler, outputs)
            recorder._tag(result, index)
            recorder._scale_pending = index
            return result

        @functools.wraps(unscale)
        def unscale_(scaler: Any, optimizer: Any) -> Any:
            if not getattr(recorder._tls, "in_scaler", False):
                recorder._event("unscale_", scaler=recorder._scaler_index(scaler), opt=recorder._optimizer_index(optimizer), enabled=bool(scaler.is_enabled()))
            return unscale(scaler, optimizer)

        @functools.wraps(step)
        def step_(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            event = recorder._event("scaler.step", scaler=recorder._scaler_index(scaler), opt=recorder._optimizer_index(optimizer), enabled=bool(scaler.is_enabled()), stepped=False)
            recorder._tls.in_scaler = True
            recorder._tls.stepped = False
            try:
                return step(scaler, optimizer, *args, **kwargs)
            finally:
                recorder._tls.in_scaler = False
                event["stepped"] = bool(getattr(recorder._tls, "stepped", False))

        @functools.wraps(update)
        def update_(scaler: Any, *args: Any, **kwargs: Any) -> Any:
            recorder._event("update", scaler=recorder._scaler_index(scaler), enabled=bool(scaler.is_enabled()))
            return update(scaler, *args, **kwargs)

        cls.scale, cls.unscale_, cls.step, cls.update = scale_, unscale_, step_, update_

    def _tag(self, result: Any, index: int) -> None:
        items = result if isinstance(result, (list, tuple)) else [result]
        for item in items:
            try:
                setattr(item, SCALER_TAG, index)
            except Exception:  # noqa: BLE001 - untaggable outputs fall back to call order
                pass

    # -- backward, optimizer, clipping ----------------------------------------------------------
    def _on_backward(self, tensors: list[Any]) -> None:
        super()._on_backward(tensors)
        tagged = next((getattr(t, SCALER_TAG) for t in tensors if hasattr(t, SCALER_TAG)), None)
        scaled_by = tagged if tagged is not None else self._scale_pending
        self._scale_pending = None
        self._event("backward", scaled_by=scaled_by)

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        super()._on_step(optimizer, args, kwargs)
        via_scaler = bool(getattr(self._tls, "in_scaler", False))
        if via_scaler:
            self._tls.stepped = True
        closure = bool(args and callable(args[0])) or kwargs.get("closure") is not None
        has_grads = any(p.grad is not None for group in optimizer.param_groups for p in group["params"])
        self._event("optimizer.step", opt=self._optimizer_index(optimizer), via_scaler=via_scaler, closure=closure, grads=has_grads)

    def _wrap_optimizer(self, cls: Any) -> None:
        recorder = self
        init, zero_grad = cls.__init__, cls.zero_grad

        @functools.wraps(init)
        def __init__(optimizer: Any, *args: Any, **kwargs: Any) -> None:
            init(optimizer, *args, **kwargs)
            recorder._optimizer_index(optimizer)

        @functools.wraps(zero_grad)
        def zero_grad_(optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            recorder._event("zero_grad", opt=recorder._optimizer_index(optimizer))
            return zero_grad(optimizer, *args, **kwargs)

        cls.__init__, cls.zero_grad = __init__, zero_grad_

    def _wrap_module_zero_grad(self, cls: Any) -> None:
        recorder = self
        zero_grad = cls.zero_grad

        @functools.wraps(zero_grad)
        def zero_grad_(module: Any, *args: Any, **kwargs: Any) -> Any:
            recorder._event("zero_grad", module=type(module).__name__)
            return zero_grad(module, *args, **kwargs)

        cls.zero_grad = zero_grad_

    def _wrap_autograd_grad(self, torch: Any) -> None:
        """`torch.autograd.grad` produces gradients too (assigned to .grad by hand, say): a step
        after it is not a step on stale gradients."""
        recorder = self
        grad = torch.autograd.grad

        @functools.wraps(grad)
        def grad_(*args: Any, **kwargs: Any) -> Any:
            if not getattr(recorder._tls, "in_backward", False):
                recorder._event("autograd.grad")
            return grad(*args, **kwargs)

        torch.autograd.grad = grad_

    def _wrap_clipping(self, torch: Any) -> None:
        """Patch both `torch.nn.utils.X` and `torch.nn.utils.clip_grad.X` before the target
        imports either name."""
        import torch.nn.utils.clip_grad as clip_module

        for name in _CLIP_FUNCTIONS:
            original = getattr(clip_module, name, None)
            if original is None:
                continue
            wrapped = self._clip_wrapper(torch, name, original)
            setattr(clip_module, name, wrapped)
            if getattr(torch.nn.utils, name, None) is original:
                setattr(torch.nn.utils, name, wrapped)

    def _clip_wrapper(self, torch: Any, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        @functools.wraps(original)
        def clip(parameters: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(recorder._tls, "in_clip", False):
                return call_original(original, parameters, *args, **kwargs)
            if not isinstance(parameters, torch.Tensor):
                parameters = list(parameters)  # a generator would be spent by the lookup below
            recorder._event("clip", fn=name, opts=recorder._owners(parameters, torch))
            recorder._tls.in_clip = True
            try:
                return call_original(original, parameters, *args, **kwargs)
            finally:
                recorder._tls.in_clip = False

        return clip

    def _owners(self, parameters: Any, torch: Any) -> list[int]:
        """Indices of the optimizers that own any of the clipped parameters."""
        wanted = {id(parameters)} if isinstance(parameters, torch.Tensor) else {id(p) for p in parameters}
        owners = []
        for index, ref in enumerate(self._optimizers):
            optimizer = ref()
            if optimizer is not None and any(id(p) in wanted for g in optimizer.param_groups for p in g["params"]):
                owners.append(index)
        return owners

    def collect(self) -> dict[str, Any]:
        from .payloads import ProtocolTracePayload  # at collect(): no start-up cost

        return ProtocolTracePayload.sent(self._record())

    def _record(self) -> dict[str, Any]:
        assert self.sites is not None
        return {
            **super()._record(),
            "events": self.events,
            "dropped_events": self.dropped,
            "sites": self.sites.sites,
            "scalers": self._scalers,
            "optimizers": len(self._optimizers),
        }
