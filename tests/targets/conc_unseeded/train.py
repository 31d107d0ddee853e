"""Shuffles with a generator seeded from the OS's entropy: two runs with the same seed differ."""

import torch


def train(steps: int = 4) -> dict[str, float]:
    data, target = torch.randn(32, 4), torch.randn(32, 1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    shuffle = torch.Generator()
    shuffle.seed()  # marker: entropy-seed
    for _ in range(steps):
        order = torch.randperm(32, generator=shuffle)[:8]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(data[order]), target[order])
        loss.backward()
        optimizer.step()
    weights = model.weight.detach().to("cpu", non_blocking=True)  # marker: nonblocking-read
    total = weights.sum()
    return {"loss": loss.item(), "weight_sum": float(total)}
