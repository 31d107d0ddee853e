"""Each step's loss copied to the host with non_blocking=True and read at once: on CUDA the
read can see the buffer before the copy lands."""

import torch
from torch import nn


def train(steps: int = 20) -> dict:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    history = []
    for step in range(steps):
        x = torch.randn(128, 64, device=device)
        y = torch.randint(0, 8, (128,), device=device)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        host = loss.detach().to("cpu", non_blocking=True)  # marker: copy
        history.append(float(host))  # marker: read
    return {"loss": history[-1]}
