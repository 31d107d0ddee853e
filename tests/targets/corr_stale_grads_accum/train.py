"""The clean control of corr_stale_grads: gradients accumulated on purpose over four
micro-batches (four backward calls, one step), then cleared after the step."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(steps: int = 8, batch_size: int = 2, grad_accum_steps: int = 4) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    optimizer.zero_grad()
    batches = iter(loader)
    for _ in range(steps):
        for _micro in range(grad_accum_steps):
            x, y = next(batches)
            loss = torch.nn.functional.mse_loss(model(x), y) / grad_accum_steps
            loss.backward()  # marker: backward
        optimizer.step()  # marker: step
        optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item()}
