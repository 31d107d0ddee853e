"""Planted defect: the mixed-precision path never calls `scaler.update()`.

With AMP off the GradScaler is disabled and `step()` just steps the optimizer, so the fp32
path trains; with AMP on (the configured `use_amp = true`) the second iteration's
`scaler.step()` raises "step() has already been called since the last update()".
"""

import torch


def run(steps: int = 6, use_amp: bool = False) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler("cpu", enabled=use_amp)
    x, y = torch.randn(64, 16), torch.randn(64, 1)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
            loss = ((model(x).float() - y) ** 2).mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # no scaler.update() after it
        losses.append(loss.item())
    return {"final_loss": losses[-1], "steps": steps}
