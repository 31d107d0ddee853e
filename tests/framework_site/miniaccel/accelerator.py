"""The accelerator: what `prepare` makes of each object, and the backward pass."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader


class AcceleratedOptimizer(torch.optim.Optimizer):
    """Wraps an optimizer; its parameter groups and state are the wrapped optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer  # no Optimizer.__init__: nothing of its own to hook

    @property  # type: ignore[override]
    def param_groups(self) -> list[dict[str, Any]]:
        return self.optimizer.param_groups

    @property  # type: ignore[override]
    def state(self) -> Any:
        return self.optimizer.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return self.optimizer.step(closure)


class Accelerator:
    def __init__(self, cpu: bool = True) -> None:
        self.device = torch.device("cpu")

    def prepare(self, *objects: Any) -> Any:
        prepared = tuple(self._prepare_one(o) for o in objects)
        return prepared if len(prepared) > 1 else prepared[0]

    def _prepare_one(self, obj: Any) -> Any:
        if isinstance(obj, torch.optim.Optimizer):
            return AcceleratedOptimizer(obj)
        if isinstance(obj, DataLoader):
            return DataLoader(obj.dataset, batch_sampler=obj.batch_sampler, collate_fn=obj.collate_fn)
        return obj.to(self.device) if isinstance(obj, torch.nn.Module) else obj

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()
