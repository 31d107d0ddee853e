"""A small training loop that keeps its settings in config.yaml and updates them after each run
(the run count and the last loss), as some experiment scripts do."""

from pathlib import Path

import torch

CONFIG = Path(__file__).resolve().parent / "config.yaml"


def read_config() -> dict[str, float]:
    """`key: value` lines, the subset of YAML this file uses."""
    pairs = (line.split(":", 1) for line in CONFIG.read_text().splitlines() if ":" in line)
    return {key.strip(): float(value) for key, value in pairs}


def train() -> dict[str, float]:
    config = read_config()
    torch.manual_seed(0)
    x, y = torch.randn(64, 4), torch.randn(64, 1)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    batch = int(config["batch_size"])
    loss = torch.zeros(())
    for step in range(int(config["steps"])):
        start = (step * batch) % len(x)
        loss = torch.nn.functional.mse_loss(model(x[start:start + batch]), y[start:start + batch])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    config.update(runs=config["runs"] + 1, last_loss=round(float(loss), 6))
    CONFIG.write_text("".join(f"{key}: {value}\n" for key, value in config.items()))
    return {"loss": float(loss)}
