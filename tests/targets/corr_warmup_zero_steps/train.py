"""A warm-up whose schedule is off by one: the factor is 0 for the first two steps, so a step
beyond the warm-up's first applies nothing: that blocks, unlike a warm-up's first step alone."""

import torch


def train(steps: int = 10, warmup: int = 4) -> dict[str, float]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, max(0, step - 1) / warmup))  # marker: scheduler
    for _ in range(steps):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # marker: step
        scheduler.step()
    return {"loss": loss.item()}
