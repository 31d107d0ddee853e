"""Planted: a temporal block as TCN repos write it, wrapping both convolutions in the
deprecated torch.nn.utils.weight_norm, and three output heads wrapped in a loop."""

import torch
from torch import nn
from torch.nn.utils import weight_norm


class TemporalBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = weight_norm(nn.Conv1d(channels, channels, 3, padding=1))  # planted: first call
        self.conv2 = weight_norm(nn.Conv1d(channels, channels, 3, padding=1))  # planted: second call
        self.heads = nn.ModuleList([weight_norm(nn.Linear(channels, 1)) for _ in range(3)])  # planted: in a loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.conv2(torch.relu(self.conv1(x))).mean(dim=2)
        return torch.stack([head(hidden) for head in self.heads]).mean()


def train(steps: int = 2) -> float:
    model = TemporalBlock(4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 4, 16)
    loss = torch.zeros(())
    for _ in range(steps):
        loss = model(x) ** 2
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.detach())
