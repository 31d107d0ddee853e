"""Clips the gradients before unscaling them: the clip threshold sees scaled gradients."""

import torch
from torch.nn.utils import clip_grad_norm_


def train(steps: int = 4) -> dict[str, float]:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu")
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        clip_grad_norm_(model.parameters(), 1.0)  # marker: clip-before-unscale
        scaler.unscale_(optimizer)
        scaler.step(optimizer)
        scaler.update()
    return {"loss": loss.item()}
