"""Datasets a spawned DataLoader worker can import by name (the start-method probe's tests)."""

from __future__ import annotations

import torch


class Numbers(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor([float(index)])


class Broken(Numbers):
    def __getitem__(self, index: int) -> torch.Tensor:
        raise ValueError("no such sample")
