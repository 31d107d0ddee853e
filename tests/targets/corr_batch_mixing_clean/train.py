"""The clean control of corr_batch_mixing: the (batch, time, feature) input becomes the GRU's
(time, batch, feature) layout with `transpose`, and a BatchNorm (whose batch statistics couple
the samples in training mode only) normalises the features."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class SequenceClassifier(torch.nn.Module):
    def __init__(self, features: int = 3, hidden: int = 16, classes: int = 4) -> None:
        super().__init__()
        self.rnn = torch.nn.GRU(features, hidden)
        self.norm = torch.nn.BatchNorm1d(hidden)
        self.head = torch.nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, features = x.shape
        steps = x.transpose(0, 1)  # marker: layout
        out, _ = self.rnn(steps)  # marker: mix
        return self.head(self.norm(out[-1]))


def train(steps: int = 8, batch_size: int = 8) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 5, 3), torch.randint(0, 4, (256,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = SequenceClassifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        loss = torch.nn.functional.cross_entropy(model(x), y)  # marker: forward
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
