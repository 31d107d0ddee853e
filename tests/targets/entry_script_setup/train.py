"""A character-level bigram model trained on data/train.bin, which the repo does not ship:
run as `python train.py --steps 6` after the data was prepared."""

import argparse
from pathlib import Path

import torch
from torch import nn


def load_tokens() -> torch.Tensor:
    raw = (Path("data") / "train.bin").read_bytes()  # FileNotFoundError until the data is prepared
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()


def main() -> float:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    tokens = load_tokens()
    torch.manual_seed(0)
    model = nn.Embedding(256, 256)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    loss = torch.zeros(())
    for _ in range(args.steps):
        starts = torch.randint(len(tokens) - args.block_size - 1, (8,))
        x = torch.stack([tokens[i : i + args.block_size] for i in starts])
        y = torch.stack([tokens[i + 1 : i + args.block_size + 1] for i in starts])
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return float(loss.detach())


if __name__ == "__main__":
    print(f"final loss {main():.3f}")
