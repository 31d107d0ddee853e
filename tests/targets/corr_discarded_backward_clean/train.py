"""The clean control of corr_discarded_backward: the same accumulation over four micro-batches,
with `optimizer.zero_grad()` right after the step that applies them."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(steps: int = 6, batch_size: int = 4, grad_accum_steps: int = 4) -> dict[str, float]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    done = 0
    for index, (x, y) in enumerate(loader):
        loss = torch.nn.functional.mse_loss(model(x), y) / grad_accum_steps
        loss.backward()  # marker: backward
        if (index + 1) % grad_accum_steps == 0:
            optimizer.step()  # marker: step
            optimizer.zero_grad()  # marker: clear
            done += 1
            if done == steps:
                break
    return {"loss": loss.item()}
