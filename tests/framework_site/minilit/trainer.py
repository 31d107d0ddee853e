"""The fit loop, in the framework's code."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn


class LightningModule(nn.Module):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        raise NotImplementedError

    def configure_optimizers(self) -> torch.optim.Optimizer:
        raise NotImplementedError

    def on_train_epoch_start(self) -> None:
        return None

    def training_epoch_end(self, outputs: list[Any]) -> None:
        return None


class LightningOptimizer:
    """Wraps the module's optimizer; its `step(closure)` is the wrapped optimizer's."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self._optimizer = optimizer

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return self._optimizer.param_groups

    def zero_grad(self) -> None:
        self._optimizer.zero_grad()

    def step(self, closure: Callable[[], torch.Tensor]) -> Any:
        return self._optimizer.step(closure=closure)


class Trainer:
    def __init__(self, max_steps: int = -1, max_epochs: int = 1000) -> None:
        self.max_steps, self.max_epochs = max_steps, max_epochs
        self.global_step = 0

    def fit(self, model: LightningModule, train_dataloaders: Iterable[Any]) -> None:
        optimizer = LightningOptimizer(model.configure_optimizers())
        model.train()
        # As Lightning 1.x: a module that overrides `training_epoch_end` gets every step's
        # output at the epoch's end, kept until then as `training_step` returned it (the
        # loss detached, any other value as it is).
        self._epoch_outputs: list[Any] = []
        keeps = type(model).training_epoch_end is not LightningModule.training_epoch_end
        for _ in range(self.max_epochs):
            model.on_train_epoch_start()
            for batch_idx, batch in enumerate(train_dataloaders):
                optimizer.step(closure=self._closure(model, optimizer, batch, batch_idx, keeps))
                self.global_step += 1
                if self.global_step == self.max_steps:
                    return
            if keeps:
                model.training_epoch_end(self._epoch_outputs)
                self._epoch_outputs = []

    def _closure(self, model: LightningModule, optimizer: LightningOptimizer, batch: Any, batch_idx: int, keeps: bool) -> Callable[[], torch.Tensor]:
        def closure() -> torch.Tensor:
            with torch.enable_grad():
                output = model.training_step(batch, batch_idx)
                loss = output["loss"] if isinstance(output, dict) else output
                optimizer.zero_grad()
                loss.backward()
            if keeps:
                self._epoch_outputs.append({**output, "loss": loss.detach()} if isinstance(output, dict) else loss.detach())
            return loss.detach()

        return closure
