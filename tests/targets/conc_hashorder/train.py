"""Builds its vocabulary by iterating a set of strings: token ids follow PYTHONHASHSEED."""

import torch

CORPUS = ["the cat sat on the mat", "a dog ate the bone", "birds sing at dawn", "the sun rose over hills"]


def build_vocab(sentences: list[str]) -> dict[str, int]:
    words = {w for s in sentences for w in s.split()}
    return {word: index for index, word in enumerate(words)}  # marker: set-iteration


def train(steps: int = 3) -> dict[str, float]:
    vocab = build_vocab(CORPUS)
    ids = [torch.tensor([vocab[w] for w in s.split()]) for s in CORPUS]
    embed = torch.nn.Embedding(len(vocab), 4)
    head = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD([*embed.parameters(), *head.parameters()], lr=0.1)
    target = torch.ones(len(CORPUS), 1)
    for _ in range(steps):
        optimizer.zero_grad()
        features = torch.stack([embed(t)[0] for t in ids])
        loss = torch.nn.functional.mse_loss(head(features), target)
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
