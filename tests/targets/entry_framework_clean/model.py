"""A classifier written for a framework (the stand-in of tests/framework_site, Lightning's
shape), the clean control: its training step feeds logits to cross_entropy."""

import torch
from minifit import Module
from torch import nn


class Classifier(Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)  # marker: loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
