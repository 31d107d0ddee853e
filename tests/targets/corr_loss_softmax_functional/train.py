"""A classifier whose forward ends in a functional `F.softmax`, trained with CrossEntropyLoss:
the loss applies log-softmax to probabilities. No module produced them, so the finding names
the line of the functional call."""

import torch
import torch.nn.functional as F


class Classifier(torch.nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.softmax(self.body(x), dim=-1)  # marker: softmax


def train(steps: int = 8) -> dict[str, float]:
    torch.manual_seed(0)
    model = Classifier()
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = torch.randn(8, 8), torch.randint(0, 4, (8,))
        loss = criterion(model(x), y)  # marker: loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        # A softmax for a metric, not fed to a loss: not judged.
        confidence = torch.softmax(model(x).detach(), dim=-1).max(dim=-1).values.mean()
    return {"loss": loss.item(), "confidence": confidence.item()}
