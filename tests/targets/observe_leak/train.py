"""A loop that sums its losses into one tensor: the running total keeps every step's autograd
graph alive."""

import torch
from torch import nn


def train(steps: int = 40) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(steps, 64, 32)
    targets = torch.randn(steps, 64, 1)
    total = torch.zeros(())
    for step in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(data[step]), targets[step])
        loss.backward()
        optimizer.step()
        total = total + loss  # marker: leak-running-total
    return float(total) / steps
