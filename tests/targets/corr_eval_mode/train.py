"""Both directions of train/eval mode: the training loss is logged under no_grad with the
model still in train mode (BatchNorm's running statistics take the logged batch, dropout is
on), and `evaluate()` puts the model in eval mode and nothing switches it back, so every
epoch after the first trains without dropout and on BatchNorm's running statistics."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(), torch.nn.Dropout(0.2))
        self.head = torch.nn.Linear(32, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def evaluate(model: Net, loader: DataLoader) -> float:
    model.eval()  # marker: eval
    with torch.no_grad():
        losses = [torch.nn.functional.mse_loss(model(x), y).item() for x, y in loader]
    return sum(losses) / len(losses)


def log_batch(model: Net, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()  # marker: logged


def train(epochs: int = 3, batch_size: int = 16) -> dict[str, float]:
    generator = torch.Generator().manual_seed(0)
    train_data = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    val_data = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = DataLoader(train_data, batch_size=batch_size, shuffle=True, generator=generator)
    val_loader = DataLoader(val_data, batch_size=batch_size)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    model.train()
    for epoch in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)  # marker: forward
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if epoch == 0:
            log_batch(model, x, y)
        val = evaluate(model, val_loader)
    return {"loss": loss.item(), "val": val}
