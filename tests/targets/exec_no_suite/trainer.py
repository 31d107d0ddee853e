"""A tiny training loop in a repo without a test suite."""

import torch


def train(steps: int = 3) -> dict:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    loss = None
    for _ in range(steps):
        loss = ((model(x) - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"steps": steps, "final_loss": float(loss)}
