"""A training script whose loop reads a batch key its dataset never provides."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    model = nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = [{"inputs": torch.randn(4, 8), "labels": torch.randn(4, 1)} for _ in range(args.steps)]
    for batch in batches:
        loss = nn.functional.mse_loss(model(batch["inputs"]), batch["targets"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
