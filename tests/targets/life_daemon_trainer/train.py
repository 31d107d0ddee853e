"""A correct training loop that detaches a background "uploader" on every call and never
stops it: each run of the entrypoint leaves a process behind."""

import os
import sys

import torch
from torch import nn

MARKER = "traingate-uploader-daemon"


def _start_uploader() -> None:
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", MARKER])
        os._exit(0)
    os.waitpid(first, 0)


def train(steps: int = 20) -> float:
    _start_uploader()  # leaves the daemon
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data, targets = torch.randn(steps, 16, 16), torch.randn(steps, 16, 1)
    total = 0.0
    for step in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(data[step]), targets[step])
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / steps
