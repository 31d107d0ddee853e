"""A regression on values near 1000 whose loss is computed under bfloat16 autocast: the
outputs are rounded to bf16's 8 bits of mantissa (steps of 4 near 1000) before the loss."""

import torch
from torch import nn


def run(steps: int = 30, amp: bool = False) -> float:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    with torch.no_grad():
        model.bias.fill_(1000.0)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x = torch.randn(steps, 64, 8)
    y = 1000.0 + x @ torch.linspace(-1, 1, 8).unsqueeze(1) * 0.5
    last = torch.zeros(())
    for step in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):  # marker: amp-autocast
            prediction = model(x[step])
            loss = (prediction - y[step]).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        last = loss.detach()
    return float(last)
