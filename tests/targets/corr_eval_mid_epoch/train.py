"""A loop that validates every few steps, in the middle of the epoch: `validate()` puts the
model in eval mode and, unless `restore` is set, nothing switches it back, so every later step
trains without dropout. The cause is the `eval()` call, not the training forward."""

import torch
from torch import nn


def validate(model: nn.Module, restore: bool) -> float:
    model.eval()  # marker: eval
    with torch.no_grad():
        x = torch.randn(16, 8)
        loss = model(x).pow(2).mean().item()
    if restore:
        model.train()
    return loss


def train(steps: int = 9, every: int = 3, restore: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.3), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    model.train()
    val = 0.0
    for step in range(steps):
        x, y = torch.randn(16, 8), torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y)  # marker: forward
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if (step + 1) % every == 0:
            val = validate(model, restore)
    return {"loss": loss.item(), "val": val}
