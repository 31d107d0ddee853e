"""A plain loop whose optimizer takes a closure (as Lightning drives it): nothing to report."""

import torch
from torch import nn


def train(steps: int = 40) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    data, targets = torch.randn(steps, 64, 32), torch.randn(steps, 64, 1)
    total = torch.zeros(())
    for step in range(steps):

        def closure() -> torch.Tensor:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(data[step]), targets[step])
            loss.backward()
            return loss

        total += optimizer.step(closure).detach()
    return float(total / steps)
