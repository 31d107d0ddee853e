"""A classifier written for a framework (the stand-in of tests/framework_site, Lightning's
shape): its model ends in a Softmax and its training step feeds those probabilities to
cross_entropy, which applies log-softmax again."""

import torch
from minifit import Module
from torch import nn


class Classifier(Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4), nn.Softmax(dim=-1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.cross_entropy(self(x), y)  # marker: loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)
