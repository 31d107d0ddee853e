"""A dataset whose `__getitem__` runs a pure-Python filterbank: almost all of each step waits
on data, and the loop takes only a few steps."""

import math

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class FilterbankDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.y = torch.randn(n, 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int):  # marker: filterbank-getitem
        signal = [math.sin(0.01 * (index + 1) * t) for t in range(1024)]
        bands = [sum(signal[t] * math.cos(math.pi * k * t / 1024) for t in range(1024)) for k in range(8)]
        return torch.tensor(bands, dtype=torch.float32), self.y[index]


def train(epochs: int = 1) -> float:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(FilterbankDataset(32), batch_size=4)
    loss = torch.zeros(())
    for _ in range(epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(loss)
