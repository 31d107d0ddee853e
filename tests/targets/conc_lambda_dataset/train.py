"""A dataset holding a lambda: workers start under fork, but it cannot be pickled for spawn."""

import torch
from torch.utils.data import DataLoader, Dataset


class Scaled(Dataset):
    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 4), torch.randn(n, 1)
        self.transform = lambda t: t * 2  # marker: lambda

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.transform(self.x[i]), self.y[i]


def train(steps: int = 3) -> dict[str, float]:
    loader = DataLoader(Scaled(24), batch_size=8, num_workers=2)  # marker: loader
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(loader):
        if step >= steps:
            break
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
