"""One clean training loop that the tests use to fit two different models: the step's line is
the same for both, the models are not."""

import torch
from torch.utils.data import DataLoader, TensorDataset


def fit(model: torch.nn.Module, steps: int) -> float:
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 3, (256,)))
    loader = DataLoader(data, batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(0))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    model.train()
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)  # marker: loss
        loss.backward()
        optimizer.step()  # marker: step
    return loss.item()
