"""Instrument keeping the loss of every backward call: where the loss first became NaN or inf,
and the loss curve a one-batch overfit run is judged by.

`Tensor.backward` and `torch.autograd.backward` are wrapped; each call keeps a detached copy
of the tensor it ran on and the target's line that made it. The values are read only after
the entrypoint returned, so the run is not synchronised at every step.

A loss scaled by a GradScaler may overflow on purpose (the scaler then skips the step and
lowers its scale): `GradScaler.scale` is wrapped to tag what it returns with the loss it
scaled, and the unscaled loss is the one kept.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any
from collections.abc import Callable

from ...harness.tensors import exact_sum
from ...harness.sites import SiteTable
from ...harness.faults import call_original, guarded

MAX_CALLS = 20_000
UNSCALED_TAG = "_unscaled_loss_watched"


class LossWatch:
    def __init__(self) -> None:
        self.sites: SiteTable | None = None
        self.calls: list[tuple[Any, int, int | None]] = []  # (detached loss, optimizer steps before it, site)
        self.dropped = 0
        self.steps = 0
        self._tls = threading.local()

    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        self.sites = SiteTable(ctx.root)
        tensor_backward = torch.Tensor.backward
        autograd_backward = torch.autograd.backward

        @functools.wraps(tensor_backward)
        def backward(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            return self._call(tensor_backward, tensor, tensor, *args, **kwargs)

        @functools.wraps(autograd_backward)
        def autograd(tensors: Any, *args: Any, **kwargs: Any) -> Any:
            first = tensors if isinstance(tensors, torch.Tensor) else next(iter(tensors), None)
            return self._call(autograd_backward, first, tensors, *args, **kwargs)

        torch.Tensor.backward = backward  # type: ignore[method-assign,assignment]  # patched while the run lasts
        torch.autograd.backward = autograd
        original_scale = torch.amp.GradScaler.scale

        @functools.wraps(original_scale)
        def scale(scaler: Any, outputs: Any) -> Any:
            scaled = original_scale(scaler, outputs)
            if isinstance(outputs, torch.Tensor) and isinstance(scaled, torch.Tensor) and scaled is not outputs:
                setattr(scaled, UNSCALED_TAG, outputs.detach())
            return scaled

        torch.amp.GradScaler.scale = scale  # type: ignore[method-assign,assignment]  # patched while the run lasts
        register_optimizer_step_pre_hook(guarded(self._on_step))

    def _on_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1

    def _call(self, original: Callable[..., Any], loss: Any, first: Any, *args: Any, **kwargs: Any) -> Any:
        # Tensor.backward calls torch.autograd.backward: one call, recorded once.
        if not getattr(self._tls, "inside", False) and loss is not None:
            assert self.sites is not None
            if len(self.calls) < MAX_CALLS:
                unscaled = getattr(loss, UNSCALED_TAG, None)
                self.calls.append((unscaled if unscaled is not None else loss.detach(), self.steps, self.sites.innermost(2)))
            else:
                self.dropped += 1
        self._tls.inside = True
        try:
            return call_original(original, first, *args, **kwargs)
        finally:
            self._tls.inside = False

    def collect(self) -> dict[str, Any]:
        from .payloads import LossesPayload  # at collect(): no start-up cost

        assert self.sites is not None
        values: list[float | None] = []
        first_bad: dict[str, Any] | None = None
        bad = 0
        for index, (tensor, step, site) in enumerate(self.calls):
            value = _value(tensor)
            values.append(value)
            if value is not None and not math.isfinite(value):
                bad += 1
                if first_bad is None:
                    first_bad = {"call": index, "step": step, "site": site, "value": repr(value)}
        finite = [v for v in values if v is not None and math.isfinite(v)]
        return LossesPayload.sent({
            "calls": len(self.calls),
            "dropped": self.dropped,
            "steps": self.steps,
            "non_finite": bad,
            "first_non_finite": first_bad,
            "first_finite": finite[:1],
            "last_non_finite": bool(values) and values[-1] is not None and not math.isfinite(values[-1]),
            "losses": [v if v is None or math.isfinite(v) else repr(v) for v in values[:2000]],
            "steps_of_calls": [step for _, step, _ in self.calls[:2000]],
            "backward_sites": sorted({site for _, _, site in self.calls if site is not None}),
            "sites": self.sites.sites,
        })


def _value(tensor: Any) -> float | None:
    """The loss (its sum when it is not a scalar), read in its own precision: a float64 loss
    through float32 would overflow to inf above 3.4e38 (a false non-finite loss) or flush to 0."""
    try:
        import torch

        return float(exact_sum(torch, tensor.detach().real).item())  # a complex loss: its real part
    except Exception:  # noqa: BLE001 - a recorder never breaks the target
        return None
