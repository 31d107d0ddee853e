"""A trainer whose `zero_grad()` sits under the scheduler's condition: with no scheduler
configured it never runs, and every step adds the earlier steps' gradients to its own."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class Trainer:
    def __init__(self, model: torch.nn.Module, scheduler_gamma: float | None = None) -> None:
        self.model = model
        self.optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, scheduler_gamma) if scheduler_gamma else None

    def train_step(self, x: torch.Tensor, y: torch.Tensor) -> float:
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        loss.backward()  # marker: backward
        self.optimizer.step()  # marker: step
        if self.scheduler:  # marker: branch
            self.scheduler.step()
            self.optimizer.zero_grad()  # marker: clear
        return loss.item()


def train(steps: int = 8, batch_size: int = 8) -> dict[str, float]:
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    trainer = Trainer(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    loss = 0.0
    for _, (x, y) in zip(range(steps), loader):
        loss = trainer.train_step(x, y)
    return {"loss": loss}
