"""Per-step scalars and per-epoch metrics of a training run.

The tracker keeps everything in memory so the entrypoint can return it; a run logs a few
scalars per step and one record per epoch, so the history stays small.
"""

from __future__ import annotations

import subprocess
from typing import Any

import torch


class MetricsTracker:
    """Collects scalars (`log_scalar`) and one record per epoch (`log_epoch`)."""

    def __init__(self, use_wandb: bool = False) -> None:
        self.use_wandb = use_wandb
        self.scalars: dict[str, list[tuple[int, float]]] = {}
        self.metrics_history: list[dict[str, Any]] = []
        self._scalar_steps: dict[str, int] = {}

    def log_scalar(self, name: str, value: float, step: int | None = None) -> None:
        """Record one value of a named scalar; the step defaults to a per-name counter."""
        if step is None:
            step = self._scalar_steps.get(name, 0)
        self._scalar_steps[name] = step + 1
        self.scalars.setdefault(name, []).append((step, float(value)))

    def scalar_total(self, name: str) -> float:
        return sum(value for _, value in self.scalars.get(name, []))

    def log_epoch(
        self,
        epoch: int,
        train_metrics: dict[str, float],
        val_metrics: dict[str, float],
        learning_rate: float,
        epoch_time_s: float,
    ) -> dict[str, Any]:
        """Store the epoch's metrics together with the device's state at its end."""
        record: dict[str, Any] = {
            "epoch": epoch,
            "train/loss": train_metrics["loss"],
            "train/grad_norm": train_metrics["grad_norm"],
            "val/loss": val_metrics["loss"],
            "val/accuracy": val_metrics["accuracy"],
            "learning_rate": learning_rate,
            "epoch_time_s": epoch_time_s,
            "gpu/utilization": self._get_gpu_utilization(),
            "gpu/memory_mb": self._get_gpu_memory_mb(),
        }
        self.metrics_history.append(record)
        return record

    def _get_gpu_utilization(self) -> float | None:
        """GPU utilisation in percent as nvidia-smi reports it; None without nvidia-smi."""
        try:
            result = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                check=False,
            )
        except FileNotFoundError:
            return None
        if result.returncode != 0 or not result.stdout.strip():
            return None
        try:
            return float(result.stdout.strip().splitlines()[0])
        except ValueError:
            return None

    @staticmethod
    def _get_gpu_memory_mb() -> float | None:
        if not torch.cuda.is_available():
            return None
        return torch.cuda.max_memory_allocated() / 2**20

    def get_summary(self) -> dict[str, Any]:
        """The last epoch's record and the best validation loss seen."""
        if not self.metrics_history:
            return {}
        best = min(self.metrics_history, key=lambda r: r["val/loss"])
        return {
            "epochs": len(self.metrics_history),
            "last": self.metrics_history[-1],
            "best_val_loss": best["val/loss"],
            "best_epoch": best["epoch"],
            "gradient_overflows": self.scalar_total("train/gradient_overflow"),
        }
