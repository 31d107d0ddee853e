"""A loop that reads values back from the device every step, in several ways."""

import torch
from torch import nn


def train(steps: int = 30) -> dict:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scheduler_hits = 0
    history = []
    for step in range(steps):
        x = torch.randn(32, 8)
        y = torch.randint(0, 4, (32,))
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        history.append(loss.item())  # marker: sync-item
        predicted = logits.argmax(dim=1).tolist()  # marker: sync-tolist
        confusion = (logits.argmax(dim=1) == y).float().cpu()  # marker: sync-cpu
        for row in logits[:3]:
            scheduler_hits += int(row.max() > 0)  # marker: sync-bool
        del predicted, confusion
    final = model(torch.randn(4, 8)).sum().item()  # marker: sync-after
    return {"loss": history[-1], "hits": scheduler_hits, "final": final}
