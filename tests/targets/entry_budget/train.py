"""A training script whose own defaults train far too long for a gate (100 epochs of 200
batches, an evaluation pass after each): the step budget makes it short without editing it."""

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def loaders(batch_size: int) -> tuple[DataLoader, DataLoader]:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(200 * batch_size, 8, generator=generator)
    y = x.sum(dim=1, keepdim=True) / 3
    train = DataLoader(TensorDataset(x, y), batch_size=batch_size, shuffle=True)
    val = DataLoader(TensorDataset(x[:1000], y[:1000]), batch_size=batch_size)
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
