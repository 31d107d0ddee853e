"""A convolutional classifier whose forward calls `F.dropout2d(h, self.p)` without
`training=`: after `model.eval()` the validation pass still drops channels at random."""

import torch
import torch.nn.functional as F
from torch import nn


class ConvNet(nn.Module):
    def __init__(self, p: float = 0.25, follow_mode: bool = False) -> None:
        super().__init__()
        self.p, self.follow_mode = p, follow_mode
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.head = nn.Linear(6 * 4 * 4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.relu(self.conv(x))
        if self.follow_mode:
            h = F.dropout2d(h, self.p, training=self.training)
        else:
            h = F.dropout2d(h, self.p)  # marker: dropout
        return self.head(h.flatten(1))


def train(steps: int = 6, follow_mode: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = ConvNet(follow_mode=follow_mode)
    optimizer = torch.optim.Adagrad(model.parameters(), lr=0.05)
    images, labels = torch.randn(40, 1, 4, 4), torch.randint(0, 3, (40,))
    for step in range(steps):
        model.train()
        batch = torch.randint(0, 32, (8,))
        loss = F.cross_entropy(model(images[batch]), labels[batch])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(images[32:]).argmax(1) == labels[32:]).float().mean()
    return {"loss": loss.item(), "accuracy": accuracy.item()}
