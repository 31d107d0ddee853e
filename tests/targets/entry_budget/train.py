"""A training script whose own defaults train far too long for a gate (100 epochs of 200
batches, an evaluation pass after each): the step budget makes it short without editing it.
Its dataset class is defined in the script, as `__main__`, and loaded by a worker process."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Sums(Dataset):
    """Inputs and a third of their sum."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.x[index].sum(dim=0, keepdim=True) / 3


def loaders(batch_size: int) -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(200 * batch_size, 8, generator=generator)
    train = DataLoader(Sums(x[:-1000]), batch_size=batch_size, shuffle=True, num_workers=1)
    val = DataLoader(Sums(x[-1000:]), batch_size=batch_size)
    return train, val


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    train, val = loaders(args.batch_size)
    for epoch in range(args.epochs):
        model.train()
        for x, y in train:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            evaluated = sum(1 for _ in val)
        print(f"epoch {epoch}: evaluated {evaluated} batches")


if __name__ == "__main__":
    main()
