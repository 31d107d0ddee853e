"""A learning rate far too high: the loss overflows to inf, then NaN, and training goes on."""

import torch


def train(steps: int = 30) -> dict[str, float]:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=50.0)
    x, y = torch.randn(64, 4) * 10, torch.randn(64, 1)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()  # marker: backward
        optimizer.step()
    return {"loss": loss.item()}
