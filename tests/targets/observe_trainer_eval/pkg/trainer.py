"""A hand-written Trainer whose `validate()` puts the model in eval mode and nothing switches it
back: every epoch after the first trains without dropout and on BatchNorm's running statistics."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Dropout(0.2))
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Trainer:
    def __init__(self, batch_size: int = 16) -> None:
        generator = torch.Generator().manual_seed(0)
        self.loader = DataLoader(TensorDataset(torch.randn(64, 8), torch.randn(64, 1)), batch_size=batch_size, shuffle=True, generator=generator)
        self.val_loader = DataLoader(TensorDataset(torch.randn(32, 8), torch.randn(32, 1)), batch_size=batch_size)
        self.model = Net()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)

    def validate(self) -> float:
        self.model.eval()  # marker: eval
        with torch.no_grad():
            losses = [torch.nn.functional.mse_loss(self.model(x), y).item() for x, y in self.val_loader]
        return sum(losses) / len(losses)

    def fit(self, epochs: int = 3) -> dict[str, float]:
        self.model.train()
        for _ in range(epochs):
            for x, y in self.loader:
                loss = torch.nn.functional.mse_loss(self.model(x), y)  # marker: forward
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
            val = self.validate()
        return {"loss": loss.item(), "val": val}
