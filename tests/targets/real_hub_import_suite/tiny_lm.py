"""A bigram language model small enough for a unit test."""

import torch
from torch import nn


class Bigram(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.logits = nn.Embedding(vocab_size, vocab_size)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.logits(tokens)
