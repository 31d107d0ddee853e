"""Mixed precision done right: forward and loss under autocast, GradScaler, no per-step reads."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_data(n: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(n, 64, generator=generator)
    w = torch.randn(64, 1, generator=generator) / 8
    y = x @ w + torch.randn(n, 1, generator=generator)
    return TensorDataset(x, y)


def train(epochs: int = 2, use_amp: bool = False) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", enabled=use_amp)
    loader = DataLoader(make_data(1280), batch_size=64, shuffle=False)
    epoch_losses = []
    for _ in range(epochs):
        running = torch.zeros(())
        for x, y in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
                loss = nn.functional.mse_loss(model(x).float(), y)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running += loss.detach()
        epoch_losses.append(running / len(loader))
    return torch.stack(epoch_losses).tolist()[-1]
