"""The clean control of perf_leak_heavy_graph: the same 10,400-node step, its losses summed
as numbers (`loss.item()`): the host memory stays flat, nothing is held across steps."""

import torch


def train(steps: int = 20, links: int = 10_400) -> float:
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(8) * 0.1)
    optimizer = torch.optim.SGD([weights], lr=0.01)
    votes = torch.randn(4, 8)
    running_loss = 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        h = votes * weights
        for _ in range(links):
            h = h + 1e-4
        loss = torch.tanh(h).pow(2).mean()
        loss.backward()
        optimizer.step()
        running_loss += loss.item()
    return float(running_loss) / steps
