"""A classifier whose model ends in a Softmax, trained with CrossEntropyLoss: the loss applies
log-softmax to probabilities, so it barely moves and the gradients shrink."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class Classifier(torch.nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))
        self.probabilities = torch.nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.probabilities(self.body(x))  # marker: softmax


def train(steps: int = 8, batch_size: int = 8) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 4, (256,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = Classifier()
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        loss = criterion(model(x), y)  # marker: loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = model(x).argmax(dim=-1)
    return {"loss": loss.item(), "accuracy": (predicted == y).float().mean().item()}
