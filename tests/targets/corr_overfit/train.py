"""Targets of shape (batch,) against outputs of shape (batch, 1): mse_loss broadcasts them to
(batch, batch), so the best the model can do is predict the mean; it cannot fit even one batch."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(epochs: int = 2) -> dict[str, float]:
    data = TensorDataset(torch.randn(64, 8), torch.randn(64))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)  # marker: loss
            optimizer.zero_grad()
            loss.backward()  # marker: backward
            optimizer.step()
    return {"loss": loss.item()}
