"""The clean control of perf_leak_epoch_total: the same epoch loop summing `loss.item()`,
a number with no graph, so nothing outlives its step."""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def train(epochs: int = 5, batch_size: int = 8) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = TensorDataset(torch.randn(64, 32), torch.randn(64, 1))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    mean = 0.0
    for _ in range(epochs):
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            total += loss.item() * x.size(0)  # marker: epoch-total
        mean = float(total) / len(data)
    return mean
