"""Planted: the entrypoint crashes with a KeyError inside a helper (the seed report's bug),
uses the deprecated torch.cuda.amp.GradScaler, and no test ever calls it."""

import torch


def _summarise(env: dict) -> int:
    return len(env["train_data"])  # planted: KeyError, the loader was renamed


def fit(epochs: int = 1) -> float:
    scaler = torch.cuda.amp.GradScaler(enabled=False)  # planted: deprecated API
    env = {"train_loader": [torch.zeros(2)] * 3, "scaler": scaler}
    print(f"fitting for {epochs} epoch(s)")
    samples = _summarise(env)
    return float(samples * epochs)
