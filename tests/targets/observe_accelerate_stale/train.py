"""A loop on Accelerate's shape (miniaccel, tests/framework_site): prepare, accelerator.backward,
optimizer.step on the wrapped optimizer; the gradients are never cleared, so every step adds
the gradients of all earlier batches to its own. No entrypoint is configured: the test that
runs the loop is the training the gate observes."""

import torch
from miniaccel import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def data() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, 10, generator=generator)
    return DataLoader(TensorDataset(x, (x[:, :3].sum(dim=1) > 0).long()), batch_size=16, shuffle=True, generator=generator)


def train(steps: int = 12) -> float:
    torch.manual_seed(0)
    accelerator = Accelerator(cpu=True)
    model = nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    model, optimizer, loader = accelerator.prepare(model, optimizer, data())  # marker: prepare
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        loss = nn.functional.cross_entropy(model(x), y)
        accelerator.backward(loss)  # marker: backward
        optimizer.step()  # marker: step
    return loss.item()
