"""Configured as the entrypoint, but it only evaluates: no optimizer ever steps."""

import torch
from torch import nn


def evaluate() -> float:
    model = nn.Linear(4, 1)
    with torch.no_grad():
        return float(model(torch.randn(8, 4)).mean())
