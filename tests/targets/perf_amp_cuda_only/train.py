"""Clean control: mixed precision is switched on only where CUDA is available, on purpose
(bfloat16 autocast on a CPU is slow for small layers). On a CPU runner autocast is never
entered with use_amp=True, and that is what the code means to do."""

import torch
from torch import nn


def run(steps: int = 30, use_amp: bool = False) -> float:
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    amp_enabled = use_amp and torch.cuda.is_available()  # marker: cuda-only-gate
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cuda", enabled=amp_enabled)
    data, targets = torch.randn(steps, 32, 16, device=device), torch.randn(steps, 32, 1, device=device)
    last = torch.zeros((), device=device)
    for step in range(steps):
        optimizer.zero_grad()
        if amp_enabled:
            with torch.autocast("cuda", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(data[step]), targets[step])
        else:
            loss = nn.functional.mse_loss(model(data[step]), targets[step])
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        last = loss.detach()
    return float(last.cpu())
