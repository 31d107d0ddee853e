"""A small classifier trained for three epochs: shuffled batches, a step decay of the learning
rate once per epoch, PyTorch's default initialisation. The base every version in
tests/test_correctness_baseline.py is compared with."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

HIDDEN = 32
LR = 0.5


def make_data(n: int = 384) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(n, 10, generator=generator)
    teacher = torch.randn(10, 4, generator=generator)
    return inputs, (inputs @ teacher).argmax(dim=1)


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(10, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, 4))


def train(epochs: int = 3, batch_size: int = 32) -> list[float]:
    torch.manual_seed(0)
    inputs, labels = make_data()
    order = torch.randperm(len(inputs))
    loader = DataLoader(TensorDataset(inputs[order], labels[order]), batch_size=batch_size)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    epoch_losses = []
    for _ in range(epochs):
        total = 0.0
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        scheduler.step()
        epoch_losses.append(total / len(loader))
    return epoch_losses
