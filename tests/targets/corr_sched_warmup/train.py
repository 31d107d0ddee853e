"""A linear warm-up written as a LambdaLR factor step / warmup: the factor is 0 at step 0, so
the scheduler sets lr = 0 before the first optimizer step."""

import torch


def train(steps: int = 10, warmup: int = 4) -> dict[str, float]:
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, step / warmup))  # marker: scheduler
    for _ in range(steps):
        x, y = torch.randn(16, 4), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()  # marker: step
        scheduler.step()
    return {"loss": loss.item()}
