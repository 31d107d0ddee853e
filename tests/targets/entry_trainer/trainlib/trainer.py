"""A trainer object, as frameworks shape them: configured in `__init__`, trained by `fit`.

The module reads its device when imported, so whatever configures it (the test conftest,
the traingate setup) must run before the import."""

import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

DEVICE = torch.device(os.environ["TRAINLIB_DEVICE"])


class Trainer:
    def __init__(self, lr: float = 0.01, batch_size: int = 16, samples: int = 160) -> None:
        generator = torch.Generator().manual_seed(2)
        x = torch.randn(samples, 16, generator=generator)
        y = x.sum(dim=1, keepdim=True) / 4
        self.loader = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
        self.model = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 1)).to(DEVICE)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=lr)

    def fit(self, epochs: int) -> float:
        """Train for `epochs` passes; the last epoch's mean loss."""
        mean = torch.zeros((), device=DEVICE)
        for _ in range(epochs):
            total = torch.zeros((), device=DEVICE)
            for x, y in self.loader:
                x, y = x.to(DEVICE), y.to(DEVICE)
                loss = nn.functional.mse_loss(self.model(x), y)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                total += loss.detach()
            mean = total / len(self.loader)
        return float(mean)
