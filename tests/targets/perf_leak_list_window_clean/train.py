"""The clean control of perf_leak_list_window: the same loop keeping each loss as a number,
and the moving average over the last three computed from numbers."""

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
        losses.append(loss.item())  # marker: leak-append
        recent = losses[-3:]
        smoothed = torch.tensor(sum(recent) / len(recent))
    return float(smoothed)
