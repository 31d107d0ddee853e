"""A label-model-like loop whose step builds a chain of about 10,400 autograd nodes, with a
running total of its losses (`running_loss += loss`, no `.item()`): every step's graph stays
alive through the total. Backward frees the tensors the nodes saved, so the tensor bytes are
flat; the graph's nodes (about 6 MB a step) are host memory, and one step's graph is already
past the probe's node-count cap. Each link is one addition: one node and one operator (its
backward passes the gradient on without one), so the instrumented run pays for about 10,400
operators a step where a chain of `tanh(h * w + c)` links would cost 38,000 for the same graph."""

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
        running_loss += loss  # marker: leak-heavy-graph
    return float(running_loss) / steps
