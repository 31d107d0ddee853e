"""A label-model-like loop whose step builds a chain of about 10,400 autograd nodes, with a
running total of its losses (`running_loss += loss`, no `.item()`): every step's graph stays
alive through the total. Backward frees the tensors the nodes saved, so the tensor bytes are
flat; the graph's nodes (about 6 MB a step) are host memory, and one step's graph is already
past the probe's node-count cap."""

import torch


def train(steps: int = 20, links: int = 3470) -> float:
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(8) * 0.1)
    optimizer = torch.optim.SGD([weights], lr=0.01)
    votes = torch.randn(4, 8)
    running_loss = 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        h = votes
        for _ in range(links):
            h = torch.tanh(h * weights + 0.1)
        loss = h.pow(2).mean()
        loss.backward()
        optimizer.step()
        running_loss += loss  # marker: leak-heavy-graph
    return float(running_loss) / steps
