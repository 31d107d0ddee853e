"""Fine-tuning with a frozen backbone: the loop meant to unfreeze the new classifier sets its
`requires_grad` to False instead, so the output layer stays at its random initialisation while
the last backbone block trains."""

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU())
        self.fc = nn.Linear(32, 5)  # marker: head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.backbone(x))


def train(steps: int = 8, train_head: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = Net()
    model.backbone.load_state_dict(Net().backbone.state_dict())  # the pretrained weights
    for p in model.backbone[:2].parameters():
        p.requires_grad = False
    for p in model.fc.parameters():
        p.requires_grad = train_head  # marker: freeze
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(steps):
        x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
        loss = nn.functional.cross_entropy(model(x), y)  # marker: loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
