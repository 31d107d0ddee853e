"""A training function that cannot run twice: it leaves a file behind and refuses to start
over it. Run 1 returns; a rerun raises before its first step."""

from pathlib import Path

import torch
from torch import nn

LEFT_BEHIND = Path(__file__).with_name("checkpoint.lock")


def train(steps: int = 6) -> dict:
    if LEFT_BEHIND.exists():
        raise RuntimeError(f"{LEFT_BEHIND.name} exists: another run holds it")  # marker: rerun-crash
    LEFT_BEHIND.write_text("taken")
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data, target = torch.randn(32, 8), torch.randn(32, 1)
    loss = torch.zeros(())
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(data), target)
        loss.backward()
        optimizer.step()
    return {"loss": float(loss)}
