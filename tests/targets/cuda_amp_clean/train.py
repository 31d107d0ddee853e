"""A clean float16 AMP loop on the GPU, with every CUDA habit done right: pinned targets
copied in with non_blocking, the GradScaler protocol in order, a side stream the default
stream waits for, and the losses copied back with non_blocking and read after the stream is
synchronised. Big enough that float16 matrix products are faster and the half-size activations
dominate the peak memory (over the cuBLAS workspaces, which no precision halves); initialised
for ReLU so that the first layers' gradients do not vanish (steps that move every layer)."""

import torch
from torch import nn


def train(steps: int = 30, width: int = 512, depth: int = 12, batch: int = 131072, use_amp: bool = True) -> dict:
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 1):
        layers += [nn.Linear(width, width), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(width, 1))
    for layer in model:
        if isinstance(layer, nn.Linear):
            nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")
            nn.init.zeros_(layer.bias)
    model = model.to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler(device, enabled=use_amp)
    pin = device == "cuda"
    targets = [torch.randn(batch, 1, pin_memory=pin) for _ in range(4)]
    side = torch.cuda.Stream() if device == "cuda" else None
    losses = []
    for step in range(steps):
        y = targets[step % len(targets)].to(device, non_blocking=True)
        x = torch.randn(batch, 64, device=device)
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                x = x * 0.5
            torch.cuda.current_stream().wait_stream(side)
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type=device, dtype=torch.float16, enabled=use_amp):
            loss = nn.functional.mse_loss(model(x).float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.detach().to("cpu", non_blocking=True))
    if device == "cuda":
        torch.cuda.current_stream().synchronize()
    history = [float(v) for v in losses]
    return {"loss": history[-1], "first_loss": history[0]}
