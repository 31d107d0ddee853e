"""A plain MLP loop: the base whose versions the side-by-side timing compares (a clean control)."""

import torch
from torch import nn


def train(steps: int = 40) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, labels = torch.randn(steps, 64, 128), torch.randint(0, 10, (steps, 64))
    total = torch.zeros(())
    for step in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data[step]), labels[step])
        loss.backward()
        optimizer.step()
        total += loss.detach()
    return float(total / steps)
