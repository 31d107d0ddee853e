"""A transform lambda local to `build_loaders`: workers start under fork, but neither loader
can be pickled for spawn. The fix is the lambda's line, not the two DataLoader lines."""

import torch
from torch.utils.data import DataLoader, Dataset


class Scaled(Dataset):
    def __init__(self, n: int, transform=None) -> None:
        self.x, self.y = torch.randn(n, 4), torch.randn(n, 1)
        self.transform = transform

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i]
        return (self.transform(x) if self.transform else x), self.y[i]


def build_loaders(n: int) -> tuple[DataLoader, DataLoader]:
    transform = lambda t: t * 2  # marker: lambda
    train = DataLoader(Scaled(n, transform), batch_size=8, num_workers=2)  # marker: train-loader
    val = DataLoader(Scaled(n // 2, transform), batch_size=8, num_workers=2)  # marker: val-loader
    return train, val


def train(steps: int = 3) -> dict[str, float]:
    train_loader, val_loader = build_loaders(24)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(train_loader):
        if step >= steps:
            break
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        val = sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in val_loader)
    return {"loss": loss.item(), "val": val}
