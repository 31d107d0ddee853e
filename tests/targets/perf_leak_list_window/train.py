"""A loop that keeps every step's loss with its autograd graph in `losses`, and logs a moving
average over the last three: `recent` and `smoothed` hold three steps at a time, `losses` all
of them. Only `losses` grows."""

import torch
from torch import nn


def train(steps: int = 40) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.randn(steps, 64, 32)
    targets = torch.randn(steps, 64, 1)
    losses = []
    smoothed = torch.zeros(())
    for step in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(data[step]), targets[step])
        loss.backward()
        optimizer.step()
        losses.append(loss)  # marker: leak-append
        recent = losses[-3:]
        smoothed = torch.stack(recent).mean()
    return float(smoothed)
