"""A classifier loop whose metrics tracker keeps every step's detached outputs: its
`reset()` clears the counters but never the stored outputs."""

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(32, 64), nn.ReLU())
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        embeddings = self.body(x)
        return self.head(embeddings), embeddings


class ClassificationTracker:
    def __init__(self) -> None:
        self._outputs: dict[int, dict[str, torch.Tensor]] = {}
        self.updates = 0

    def update(self, step: int, logits: torch.Tensor, embeddings: torch.Tensor) -> None:
        self.updates += 1
        self._outputs[step] = {"logits": logits.detach(), "embeddings": embeddings.detach()}  # marker: tracker-store

    def reset(self) -> None:
        self.updates = 0


def train(steps: int = 40) -> int:
    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    tracker = ClassificationTracker()
    data = torch.randn(steps, 64, 32)
    labels = torch.randint(0, 10, (steps, 64))
    for step in range(steps):
        logits, embeddings = model(data[step])
        loss = nn.functional.cross_entropy(logits, labels[step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        tracker.update(step, logits, embeddings)
    tracker.reset()
    return tracker.updates
