"""A small, correct training loop that records a reproducibility snapshot of each run in
tracked files, as research repositories do: settings and results, the environment as
`pip freeze` would list it (environment/requirements.txt, written and never read) and the
run's metrics (results/metrics.json)."""

import json
import time
from importlib import metadata
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

HERE = Path(__file__).resolve().parent
REPRO = HERE / "repro"


def train(steps: int = 12, batch_size: int = 4) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    batches = iter(loader)
    losses = []
    for _ in range(steps):
        x, y = next(batches)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    final = float(torch.stack(losses)[-1])
    write_snapshot(steps, batch_size, final)
    return {"loss": final}


def write_snapshot(steps: int, batch_size: int, loss: float) -> None:
    """Overwrites the tracked snapshot files with this run's settings and result."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
    run = {"steps": steps, "batch_size": batch_size, "final_loss": loss, "torch": torch.__version__, "written": stamp}
    (REPRO / "snapshot.json").write_text(json.dumps(run, indent=1) + "\n")
    (REPRO / "summary.md").write_text(f"| steps | batch | final loss |\n|---|---|---|\n| {steps} | {batch_size} | {loss:.4f} |\n")
    (REPRO / "metrics.txt").write_text(f"final_loss {loss:.6f}\nwritten {stamp}\n")
    frozen = sorted(f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions() if d.metadata["Name"])
    (HERE / "environment" / "requirements.txt").write_text("\n".join(frozen) + "\n")
    (HERE / "results" / "metrics.json").write_text(json.dumps({"final_loss": loss, "written": stamp}) + "\n")
