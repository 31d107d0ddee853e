"""On the GPU: the loss read back with .item() every step (a host-device synchronisation per
step) and every step's loss kept with its graph (device memory that grows each step)."""

import torch
from torch import nn


def train(steps: int = 30) -> dict:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 4)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    kept = []
    printed = 0.0
    for step in range(steps):
        x = torch.randn(256, 256, device=device)
        y = torch.randint(0, 4, (256,), device=device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        printed += loss.item()  # marker: sync-item
        kept.append(loss)  # marker: leak-graph
    return {"loss": printed / steps, "kept": len(kept)}
