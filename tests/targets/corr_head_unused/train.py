"""A self-supervised trainer over a network with a classification head: the loss reads the
backbone's features through a forward hook, and the head, kept in the optimizer, runs its forward
but its output reaches no loss (it is trained later, by a linear probe): a design choice. With
`detach_head`, the loss is given the head's output through `detach()`: a cut, the bug."""

import torch
from torch import nn


class Network(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 16))
        self.head = nn.Linear(16, 4)  # marker: head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))


def train(steps: int = 8, detach_head: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = Network()
    features: list[torch.Tensor] = []
    model.backbone.register_forward_hook(lambda module, args, output: features.append(output))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    for _ in range(steps):
        x = torch.randn(32, 12)
        features.clear()
        logits = model(x)
        a, b = features[0].chunk(2)
        loss = 1 - nn.functional.cosine_similarity(a, b).mean()
        if detach_head:
            loss = loss + logits.detach().pow(2).mean()  # marker: detach
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    with torch.no_grad():  # a validation pass through the whole network, head included
        model(torch.randn(8, 12))
    return {"loss": loss.item()}
