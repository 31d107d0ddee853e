"""Each batch is scaled on a side stream that never waits for the default stream, where the
batch was written: the side stream's kernel can read it before it is there."""

import torch
from torch import nn


def train(steps: int = 20) -> dict:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    side = torch.cuda.Stream() if device == "cuda" else None
    loss = torch.zeros(())
    for step in range(steps):
        x = torch.randn(128, 64, device=device)
        y = torch.randn(128, 1, device=device)
        if side is not None:
            with torch.cuda.stream(side):
                x = x * 0.5  # marker: side-stream
            torch.cuda.current_stream().wait_stream(side)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
