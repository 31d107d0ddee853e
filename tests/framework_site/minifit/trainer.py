"""The loop of the stand-in framework: optimizer from the module, train, then validate."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Module(nn.Module):
    """What the user subclasses: a step that returns the loss, and the optimizer to use."""

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        raise NotImplementedError

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def configure_optimizers(self) -> torch.optim.Optimizer:
        raise NotImplementedError


class Trainer:
    def __init__(self, max_epochs: int = 1000) -> None:
        self.max_epochs = max_epochs

    def fit(self, model: Module, train_dataloaders: Any, val_dataloaders: Any = None) -> None:
        optimizer = model.configure_optimizers()
        for _ in range(self.max_epochs):
            model.train()
            for index, batch in enumerate(train_dataloaders):
                loss = model.training_step(batch, index)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            if val_dataloaders is not None:
                model.eval()
                with torch.no_grad():
                    for index, batch in enumerate(val_dataloaders):
                        model.validation_step(batch, index)
