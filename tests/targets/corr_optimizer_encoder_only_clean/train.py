"""An autoencoder whose optimizer is built over the encoder's parameters only: the decoder
receives gradients at every step but never trains. The cause is the optimizer's construction,
not the decoder's layer."""

import torch
from torch import nn


class AutoEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
        self.decoder = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 16))  # marker: decoder

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


def train(steps: int = 8, whole_model: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = AutoEncoder()
    params = model.parameters() if whole_model else model.encoder.parameters()
    optimizer = torch.optim.Adam(params, lr=1e-3)  # marker: optimizer
    for _ in range(steps):
        x = torch.randn(32, 16)
        loss = nn.functional.mse_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
