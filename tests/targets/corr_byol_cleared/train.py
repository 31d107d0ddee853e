"""A BYOL-style self-supervised trainer: an online network (backbone, projector, predictor)
learns to predict the projection an EMA target network gives of another view of the same
sample. The target runs under `torch.no_grad()` in train mode (its BatchNorm normalises with
the batch's statistics, as the online network's does): its outputs are the targets of the same
step's loss, so that forward is training. As the method's canonical usage does, the optimizer
is built over every parameter of the model: the target's (frozen, moved by the EMA update
between steps) and the backbone's classification head, which the method never calls."""

import copy

import torch
from torch import nn


class Backbone(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(nn.Linear(8, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 16))
        self.classifier = nn.Linear(16, 4)  # marker: head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


def mlp(width_in: int, width_out: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, width_out))


class BYOL(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = Backbone()
        self.projector = mlp(16, 8)
        self.predictor = mlp(8, 8)
        self.target_backbone = copy.deepcopy(self.backbone)
        self.target_projector = copy.deepcopy(self.projector)
        for p in [*self.target_backbone.parameters(), *self.target_projector.parameters()]:
            p.requires_grad = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.predictor(self.projector(self.backbone(x)))

    def forward_target(self, x: torch.Tensor) -> torch.Tensor:
        return self.target_projector(self.target_backbone(x))  # marker: target

    @torch.no_grad()
    def update_target(self, momentum: float) -> None:
        for online, target in ((self.backbone, self.target_backbone), (self.projector, self.target_projector)):
            for p, q in zip(online.parameters(), target.parameters()):
                q.mul_(momentum).add_(p.detach(), alpha=1 - momentum)


def byol_loss(prediction: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    prediction, target = nn.functional.normalize(prediction, dim=-1), nn.functional.normalize(target, dim=-1)
    return (2 - 2 * (prediction * target).sum(dim=-1)).mean()


def augment(x: torch.Tensor) -> torch.Tensor:
    return x + 0.1 * torch.randn_like(x)


def train(steps: int = 8, clear_late: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = BYOL()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.06, momentum=0.9)
    data = torch.randn(64, 8)
    for step in range(steps):
        x = data[torch.randint(0, 64, (16,))]
        view_a, view_b = augment(x), augment(x)
        model.update_target(0.99)
        with torch.no_grad():
            target_a, target_b = model.forward_target(view_a), model.forward_target(view_b)
        loss = byol_loss(model(view_a), target_b) + byol_loss(model(view_b), target_a)
        if not clear_late:
            optimizer.zero_grad()
        loss.backward()  # marker: backward
        if clear_late:
            optimizer.zero_grad()  # marker: clear
        optimizer.step()  # marker: step
    return {"loss": loss.item()}
