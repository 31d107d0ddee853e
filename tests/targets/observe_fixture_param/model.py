"""Training done by a pytest fixture for a parametrised test class: the gradients are cleared
once, before the loop, so each step adds the gradients of every earlier batch."""

import torch


def fit(lr: float, steps: int) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    optimizer.zero_grad()
    for _ in range(steps):
        x = torch.randn(8, 4)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()  # marker: step
    return model
