"""A training script as repos ship them: argparse options, a loop over a few optimizer steps,
run as `python train.py --steps 16`. The clean control of the script entrypoint."""

import argparse
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset


class Regression(Dataset):
    """A fixed linear problem with noise."""

    def __init__(self, n: int) -> None:
        generator = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 32, generator=generator)
        self.y = self.x @ (torch.randn(32, 1, generator=generator) / 6) + 0.1 * torch.randn(n, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="train a tiny regressor")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> float:
    args = parse_args(argv)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    loader = DataLoader(Regression(args.steps * args.batch_size), batch_size=args.batch_size, shuffle=True)
    running = torch.zeros(())
    for x, y in loader:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.amp):
            loss = nn.functional.mse_loss(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running += loss.detach()
    return float(running / len(loader))


if __name__ == "__main__":
    final = main()
    print(f"mean loss {final:.4f}")
    sys.exit(0)
