"""A Trainer class that caches every step's features and never evicts them."""

import torch
from torch import nn


class Trainer:
    def __init__(self) -> None:
        torch.manual_seed(0)
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.Tanh())
        self.head = nn.Linear(64, 1)
        params = list(self.encoder.parameters()) + list(self.head.parameters())
        self.optimizer = torch.optim.Adam(params, lr=1e-3)
        self.feature_cache: dict[int, torch.Tensor] = {}

    def training_step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        features = self.encoder(x)
        self.feature_cache[step] = features.detach().clone()  # marker: leak-cache
        loss = nn.functional.mse_loss(self.head(features), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()


def fit(steps: int = 40) -> int:
    trainer = Trainer()
    data = torch.randn(steps, 128, 16)
    targets = torch.randn(steps, 128, 1)
    for step in range(steps):
        trainer.training_step(step, data[step], targets[step])
    return len(trainer.feature_cache)
