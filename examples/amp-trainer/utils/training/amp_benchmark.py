"""AMP speedup benchmark: the same fine-tuning run with and without mixed precision.

The T035 targets are a 1.5x speedup, a 40 % peak-memory reduction and a final loss within
1 % of full precision. Peak memory is the CUDA allocator's; on the CPU it is not measured
and the memory target does not apply.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from utils.tier3_training_utilities import test_fine_tuning

SPEEDUP_TARGET = 1.5
MEMORY_REDUCTION_TARGET = 0.40
ACCURACY_TOLERANCE = 0.01


def _timed_run(use_amp: bool, **kwargs: Any) -> dict[str, Any]:
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    results = test_fine_tuning(use_amp=use_amp, **kwargs)
    elapsed = time.perf_counter() - started
    peak = torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None
    return {"time_s": elapsed, "peak_memory_mb": peak, "final_loss": results["final_loss"], "results": results}


def test_amp_speedup_benchmark(
    n_epochs: int = 3,
    batch_size: int = 4,
    n_samples: int = 50,
    use_gpu: bool = True,
    **kwargs: Any,
) -> dict[str, Any]:
    """Run full precision, then AMP, and compare time, peak memory and final loss."""
    common = dict(n_epochs=n_epochs, batch_size=batch_size, n_samples=n_samples, use_gpu=use_gpu, **kwargs)
    fp32 = _timed_run(False, **common)
    amp = _timed_run(True, **common)

    speedup = fp32["time_s"] / amp["time_s"] if amp["time_s"] > 0 else float("nan")
    memory_reduction = None
    if fp32["peak_memory_mb"] and amp["peak_memory_mb"] is not None:
        memory_reduction = 1.0 - amp["peak_memory_mb"] / fp32["peak_memory_mb"]
    loss_drift = abs(amp["final_loss"] - fp32["final_loss"]) / max(abs(fp32["final_loss"]), 1e-12)

    requirements = {
        "speedup": speedup >= SPEEDUP_TARGET,
        "memory_reduction": memory_reduction is not None and memory_reduction >= MEMORY_REDUCTION_TARGET,
        "accuracy": loss_drift < ACCURACY_TOLERANCE,
    }
    print(f"AMP speedup: {speedup:.2f}x (target {SPEEDUP_TARGET}x)")
    if memory_reduction is None:
        print("Memory reduction: not measured (no CUDA)")
    else:
        print(f"Memory reduction: {memory_reduction:.1%} (target {MEMORY_REDUCTION_TARGET:.0%})")
    print(f"Final loss drift: {loss_drift:.2%} (tolerance {ACCURACY_TOLERANCE:.0%})")
    return {
        "fp32_time_s": fp32["time_s"],
        "amp_time_s": amp["time_s"],
        "speedup": speedup,
        "fp32_peak_memory_mb": fp32["peak_memory_mb"],
        "amp_peak_memory_mb": amp["peak_memory_mb"],
        "memory_reduction": memory_reduction,
        "fp32_final_loss": fp32["final_loss"],
        "amp_final_loss": amp["final_loss"],
        "loss_drift": loss_drift,
        "requirements_met": requirements,
        "device": amp["results"]["device"],
    }
