"""The loop waits for an event its producer thread never sets."""

import threading

import torch


def train(steps: int = 2) -> dict[str, float]:
    ready = threading.Event()
    batches: list[torch.Tensor] = []

    def produce() -> None:
        batches.append(torch.randn(8, 4))  # forgets ready.set()

    threading.Thread(target=produce, daemon=True).start()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        ready.wait()  # marker: waits-forever
        optimizer.zero_grad()
        loss = model(batches[-1]).pow(2).mean()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
