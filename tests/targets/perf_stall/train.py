"""A dataset that takes far longer to produce a sample than the model takes to train on it."""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class SlowDataset(Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 8)
        self.y = torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):  # marker: slow-getitem
        time.sleep(0.004)
        return self.x[index], self.y[index]


def train(epochs: int = 1) -> float:
    torch.manual_seed(0)
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(SlowDataset(96), batch_size=4, shuffle=True)
    loss = torch.zeros(())
    for _ in range(epochs):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return float(loss)
