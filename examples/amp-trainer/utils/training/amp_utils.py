"""Precision selection and loss-scale logging for mixed-precision training.

The trainer objects these helpers read are duck-typed: anything with
`trainer.strategy.precision_plugin.scaler` works (a Lightning trainer does), and the
callback logs to any object with a `log(dict)` method (a wandb run does).
"""

from __future__ import annotations

import math
from typing import Any

# Lightning's precision names mapped to the dtype autocast runs in.
_PRECISION_DTYPES = {
    "16": "float16",
    "16-mixed": "float16",
    "16-true": "float16",
    "bf16": "bfloat16",
    "bf16-mixed": "bfloat16",
    "bf16-true": "bfloat16",
    "32": "float32",
    "32-true": "float32",
}


def compute_effective_precision(
    requested_precision: str, use_amp: bool | None, cuda_available: bool, use_gpu: bool
) -> str:
    """The precision a run will really use.

    `use_amp=None` leaves the requested precision alone; `use_amp=True` gives 16-bit only
    where it can run (CUDA present and the GPU chosen), otherwise full precision; `False`
    always means full precision.
    """
    if use_amp is None:
        return requested_precision
    if use_amp and cuda_available and use_gpu:
        return "16"
    return "32"


class AmpWandbCallback:
    """Logs the AMP loss scale and precision at the end of each training epoch."""

    def __init__(self, enabled: bool = True, precision: str = "16-mixed", run: Any = None) -> None:
        self.enabled = enabled
        self.precision = precision
        self.run = run
        self.autocast_dtype = _PRECISION_DTYPES.get(str(precision), "float32")
        self.amp_active = enabled and self.autocast_dtype != "float32"

    @staticmethod
    def get_loss_scale(trainer: Any) -> float | None:
        """The GradScaler's current scale, or None when the trainer has no scaler."""
        plugin = getattr(getattr(trainer, "strategy", None), "precision_plugin", None)
        scaler = getattr(plugin, "scaler", None)
        if scaler is None:
            return None
        scale = scaler.get_scale()
        try:
            return float(scale)
        except (TypeError, ValueError):
            return None

    def on_train_epoch_end(self, trainer: Any, pl_module: Any = None) -> dict[str, Any] | None:
        """Log to the run; returns what was logged (None when nothing was)."""
        if not self.enabled or self.run is None:
            return None
        record: dict[str, Any] = {"amp/enabled": self.amp_active, "amp/precision": str(self.precision)}
        scale = self.get_loss_scale(trainer)
        if scale is not None:
            record["amp/loss_scale"] = scale
            record["amp/loss_scale_log2"] = math.log2(scale) if 0 < scale < math.inf else None
        self.run.log(record, step=getattr(trainer, "global_step", None))
        return record
