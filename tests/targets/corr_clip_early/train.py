"""A recurrent model trained with `clip_grad_norm_` called after `zero_grad()` and before
`backward()`: it clips empty gradients, and the gradients the step applies are never clipped."""

import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(5, 12, batch_first=True)
        self.out = nn.Linear(12, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.rnn(x)[0])


def train(steps: int = 6, clip_first: bool = True) -> dict[str, float]:
    torch.manual_seed(0)
    model = Tagger()
    optimizer = torch.optim.NAdam(model.parameters(), lr=2e-3)
    for step in range(steps):
        x, tags = torch.randn(4, 7, 5), torch.randint(0, 3, (4, 7))
        optimizer.zero_grad()
        if clip_first:
            clip_grad_norm_(model.parameters(), max_norm=0.5)  # marker: clip
        loss = nn.functional.cross_entropy(model(x).flatten(0, 1), tags.flatten())
        loss.backward()  # marker: backward
        if not clip_first:
            clip_grad_norm_(model.parameters(), max_norm=0.5)
        optimizer.step()
    return {"loss": loss.item()}
