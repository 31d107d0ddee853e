"""`[tool.traingate.performance]`: the performance stage's section of the target's configuration (docs/configuration.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class PerformanceConfig(BaseModel):
    """`[tool.traingate.performance]`: how long the profiled runs are."""

    model_config = _STRICT
    warmup_steps: int = Field(default=3, ge=0)
    min_steps: int = Field(default=8, ge=1, description="fewer profiled steps than this: not measured")
    timing_runs: int = Field(default=1, ge=1, description="uninstrumented runs per AMP setting")
