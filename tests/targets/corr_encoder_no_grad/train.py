"""An encoder kept in the optimizer whose every training forward runs under `torch.no_grad()`
(left over from a frozen-feature experiment): its parameters never receive a gradient. A cut,
high, at the call under no_grad; not an output that reaches no loss."""

import torch
from torch import nn


def train(steps: int = 8) -> dict[str, float]:
    torch.manual_seed(0)
    encoder = nn.Sequential(nn.Linear(12, 16), nn.ReLU())  # marker: encoder
    head = nn.Linear(16, 1)
    optimizer = torch.optim.Adam([*encoder.parameters(), *head.parameters()], lr=1e-3)
    for _ in range(steps):
        x, y = torch.randn(16, 12), torch.randn(16, 1)
        with torch.no_grad():
            features = encoder(x)  # marker: no-grad
        loss = nn.functional.mse_loss(head(features), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
