"""The clean control of corr_eval_mode: `evaluate()` switches the model back to train mode,
the logged loss is computed in eval mode, and BatchNorm's statistics are recomputed at the
end with `swa_utils.update_bn` (a library's forward in train mode under no_grad, on purpose)."""

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
    model.eval()
    with torch.no_grad():
        losses = [torch.nn.functional.mse_loss(model(x), y).item() for x, y in loader]
    model.train()
    return sum(losses) / len(losses)


def log_batch(model: Net, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x), y).item()
    model.train()
    return loss


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
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if epoch == 0:
            log_batch(model, x, y)
        val = evaluate(model, val_loader)
    torch.optim.swa_utils.update_bn(((x,) for x, _ in loader), model)
    return {"loss": loss.item(), "val": val}
