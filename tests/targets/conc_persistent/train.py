"""Re-creates a persistent-worker DataLoader every epoch: its workers restart each time."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(epochs: int = 3) -> dict[str, float]:
    dataset = TensorDataset(torch.randn(16, 4), torch.randn(16, 1))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        loader = DataLoader(dataset, batch_size=8, num_workers=2, persistent_workers=True)  # marker: recreated
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
    return {"loss": loss.item()}
