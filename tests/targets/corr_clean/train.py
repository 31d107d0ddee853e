"""A small training loop with none of the correctness bugs: a warm-up that starts above 0,
every layer in the optimizer, shuffled data, and the loss divided by the accumulation steps."""

import math

import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.body(x)))


def get_lr(it: int, warmup: int = 4, base: float = 0.05) -> float:
    if it < warmup:
        return base * (it + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, (it - warmup) / 20)))


def train(steps: int = 12, grad_accum_steps: int = 1, batch_size: int = 4) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=get_lr(0))
    batches = iter(loader)
    for it in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(it)
        for _ in range(grad_accum_steps):
            x, y = next(batches)
            loss = torch.nn.functional.mse_loss(model(x), y) / grad_accum_steps
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item()}
