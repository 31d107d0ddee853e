"""`[tool.traingate.concurrency]`: the concurrency stage's section of the target's configuration (docs/configuration.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class ConcurrencyConfig(BaseModel):
    """`[tool.traingate.concurrency]`."""

    model_config = _STRICT
    determinism_runs: int = Field(default=2, ge=2)
    dataloader_start_methods: list[str] = Field(default_factory=lambda: ["fork", "spawn"])
