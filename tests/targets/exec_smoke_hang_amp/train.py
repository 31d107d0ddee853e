"""Trains with AMP on; with AMP off it waits for an event nothing sets (the planted hang)."""

import threading

import torch


def run(steps: int = 3, use_amp: bool = False) -> float:
    if not use_amp:
        threading.Event().wait()  # planted: nothing ever sets it
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.zeros(())
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(torch.ones(8, 4)).float().pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"trained {steps} steps")
    return float(loss)
