"""Workers with a seeded generator and a module-level worker_init_fn: same batches every run,
under fork and spawn alike."""

import random

import torch
from torch.utils.data import DataLoader, Dataset


class Noisy(Dataset):
    def __init__(self, n: int) -> None:
        self.x, self.y = torch.randn(n, 4), torch.randn(n, 1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] + 0.01 * torch.randn(4), self.y[i]


def seed_worker(worker_id: int) -> None:
    random.seed(torch.initial_seed() % 2**32)


def train(epochs: int = 1) -> dict[str, float]:
    generator = torch.Generator()
    generator.manual_seed(0)
    loader = DataLoader(Noisy(24), batch_size=8, shuffle=True, num_workers=2, worker_init_fn=seed_worker, generator=generator)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
    return {"loss": loss.item()}
