"""A clean training loop: the gradients are cleared before every step."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def train_classifier(steps: int = 6, batch_size: int = 8) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()  # marker: step
    return {"loss": loss.item()}
