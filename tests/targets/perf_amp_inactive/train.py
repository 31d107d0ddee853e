"""AMP switched on, but the forward pass runs after the autocast block has closed."""

import torch
from torch import nn


def run(steps: int = 30, use_amp: bool = False) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, targets = torch.randn(steps, 32, 16), torch.randn(steps, 32, 1)
    last = torch.zeros(())
    for step in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):  # marker: amp-empty
            pass
        loss = nn.functional.mse_loss(model(data[step]), targets[step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last = loss.detach()
    return float(last)
