"""Two ways to leave part of a model untrained: a head attached after the optimizer was
built, and an encoder layer whose output is detached before the loss."""

import torch


class Encoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Linear(6, 12)
        self.layers = torch.nn.ModuleList([torch.nn.Linear(12, 12) for _ in range(2)])
        self.gate = torch.nn.Linear(12, 12)  # marker: gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))
        for layer in self.layers:
            h = torch.tanh(layer(h))
        return h + torch.sigmoid(self.gate(h)).detach()  # marker: detach


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()


def train(steps: int = 8) -> dict[str, float]:
    model = Model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)  # marker: optimizer
    model.head = torch.nn.Linear(12, 1)  # marker: late-head
    for _ in range(steps):
        x, y = torch.randn(16, 6), torch.randn(16, 1)
        loss = torch.nn.functional.mse_loss(model.head(model.encoder(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
