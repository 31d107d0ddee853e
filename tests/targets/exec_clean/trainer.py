"""A tiny training loop: the clean control of the execution stage."""

import torch


def train(steps: int = 3, use_amp: bool = False) -> dict:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    losses = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
            loss = ((model(x).float() - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    print(f"trained {steps} steps, final loss {losses[-1]:.4f}")
    return {"steps": steps, "final_loss": losses[-1]}
