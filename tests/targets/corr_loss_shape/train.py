"""A regression head of shape (B, 1) against targets of shape (B,) into `nn.HuberLoss`, with
PyTorch's size warning silenced: the loss broadcasts to (B, B) and trains every prediction
towards the batch's mean target."""

import warnings

import torch
from torch import nn


class Regressor(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 24), nn.SiLU(), nn.Linear(24, 24), nn.SiLU())
        self.out = nn.Linear(24, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.body(x))


def train(steps: int = 8, squeeze: bool = False) -> dict[str, float]:
    warnings.filterwarnings("ignore", message="Using a target size")
    torch.manual_seed(0)
    model = Regressor()
    criterion = nn.HuberLoss(delta=0.5)
    optimizer = torch.optim.RMSprop(model.parameters(), lr=1e-3)
    x_all = torch.randn(96, 6)
    y_all = x_all[:, 0] - 0.5 * x_all[:, 1]  # shape (N,)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x_all, y_all), batch_size=12, shuffle=True)
    for step, (x, y) in zip(range(steps), loader):
        prediction = model(x)
        if squeeze:
            prediction = prediction.squeeze(-1)
        loss = criterion(prediction, y)  # marker: loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
