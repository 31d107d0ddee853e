"""The performance stage's configuration (docs/configuration.md): its section
`[tool.traingate.performance]` and its thresholds under `[tool.traingate.policy]`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from traingate.stages.api import Stricter

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class PerformanceConfig(BaseModel):
    """`[tool.traingate.performance]`: how long the profiled runs are."""

    model_config = _STRICT
    warmup_steps: int = Field(default=3, ge=0)
    min_steps: int = Field(default=8, ge=1, description="fewer profiled steps than this: not measured")
    # More runs verify more: a change that lowers it narrows its verification (`Stricter.HIGHER`).
    timing_runs: Annotated[int, Stricter.HIGHER] = Field(default=1, ge=1, description="uninstrumented runs per AMP setting")


class PerformancePolicy(BaseModel):
    """The performance stage's thresholds, keys of `[tool.traingate.policy]` (docs/contract.md, section 1)."""

    model_config = _STRICT
    amp_speedup_min: Annotated[float, Stricter.HIGHER] = 1.5  # gates on CUDA only; measured and reported on every device
    amp_memory_reduction_min: Annotated[float, Stricter.HIGHER] = 0.40  # gates on CUDA only
    amp_accuracy_tolerance: Annotated[float, Stricter.LOWER] = 0.01  # relative drift of the final loss, AMP vs full precision
