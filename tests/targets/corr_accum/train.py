"""Gradient accumulation with the loss not divided by the accumulation steps: the
accumulated gradient is grad_accum_steps times that of one large batch."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(steps: int = 6, grad_accum_steps: int = 2, batch_size: int = 4) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches = iter(loader)
    for _ in range(steps):
        for _micro in range(grad_accum_steps):
            x, y = next(batches)
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # marker: backward
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item()}
