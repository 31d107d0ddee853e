"""The documented AMP loop: accumulation, unscale_ before clipping, an overflow guard, update."""

import torch


def train(steps: int = 4, accumulate: int = 2) -> dict[str, float]:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device)
    data, target = torch.randn(32, 4), torch.randn(32, 1)
    skipped = 0
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for micro in range(accumulate):
            x = data[micro * 8:(micro + 1) * 8].to(device, non_blocking=True)
            y = target[micro * 8:(micro + 1) * 8].to(device, non_blocking=True)
            with torch.autocast(device_type=device, dtype=torch.bfloat16):
                loss = torch.nn.functional.mse_loss(model(x).float(), y) / accumulate
            if step == 1 and micro == 0:
                loss = loss * float("inf")  # one overflowing iteration
            scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if torch.isfinite(grad_norm):
            scaler.step(optimizer)
        else:
            skipped += 1
        scaler.update()
    return {"loss": loss.item(), "skipped": skipped}
