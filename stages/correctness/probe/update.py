"""Instrument recording the first optimizer update, then ending the run.

At the first `step()` it keeps, for each parameter of the optimizer's groups (in group
order), the gradient the step is about to apply and, after it, the parameter's change: the
full L2 norm of each and up to `SAMPLES` evenly spaced elements. Then it ends the entrypoint
by raising `FirstStepReached` (a BaseException, so the target's `except Exception` lets it
through): one update is all the gradient-accumulation comparison needs.
"""

from __future__ import annotations

from typing import Any

from ...harness.tensors import even_indexes, real_values
from ...harness.faults import guarded

SAMPLES = 64
STOP = "FirstStepReached"


class FirstStepReached(BaseException):
    """Raised by the instrument after the first optimizer step; the stage expects it."""


class FirstUpdate:
    def __init__(self) -> None:
        self.params: list[dict[str, Any]] = []
        self._before: list[Any] = []
        self.done = False

    def install(self, ctx: Any) -> None:
        import torch
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        self.torch = torch
        register_optimizer_step_pre_hook(guarded(self._pre))
        register_optimizer_step_post_hook(guarded(self._post))

    def _pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.done:
            return
        torch = self.torch
        with torch.no_grad():
            for group_index, group in enumerate(optimizer.param_groups):
                for p in group["params"]:
                    flat = p.detach().reshape(-1)
                    index = even_indexes(torch, flat.numel(), SAMPLES, flat.device)
                    grad = p.grad.detach().reshape(-1) if p.grad is not None else None
                    self.params.append(
                        {
                            "group": group_index,
                            "numel": flat.numel(),
                            "grad_norm": _norm(torch, grad) if grad is not None else None,
                            "grad_sample": _sample(torch, grad, index) if grad is not None else None,
                        }
                    )
                    self._before.append((p, flat.clone(), index))

    def _post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.done:
            return
        self.done = True
        torch = self.torch
        with torch.no_grad():
            for record, (p, before, index) in zip(self.params, self._before, strict=True):
                change = p.detach().reshape(-1) - before
                record["update_norm"] = _norm(torch, change)
                record["update_sample"] = _sample(torch, change, index)
        self._before.clear()
        raise FirstStepReached("the first optimizer step was recorded")

    def collect(self) -> dict[str, Any]:
        from .payloads import FirstUpdatePayload  # at collect(): no start-up cost

        return FirstUpdatePayload.sent({"stepped": self.done, "params": self.params, "stop": STOP})


def _norm(torch: Any, flat: Any) -> float:
    """The L2 norm of a gradient or update, accumulated in float64 whatever its dtype."""
    return float(torch.linalg.vector_norm(real_values(torch, flat), dtype=torch.float64))


def _sample(torch: Any, flat: Any, index: Any) -> list[float]:
    """The sampled elements as float64 numbers (exact for every real dtype; a complex element
    as its real and imaginary parts)."""
    sampled: list[float] = real_values(torch, flat[index]).double().cpu().tolist()
    return sampled

