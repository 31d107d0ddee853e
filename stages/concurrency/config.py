"""`[tool.traingate.concurrency]`: the concurrency stage's section of the target's configuration (docs/configuration.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from traingate.stages.api import Stricter

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class ConcurrencyConfig(BaseModel):
    """`[tool.traingate.concurrency]`."""

    model_config = _STRICT
    # More runs verify more: a change that lowers it narrows its verification (`Stricter.HIGHER`).
    determinism_runs: Annotated[int, Stricter.HIGHER] = Field(default=2, ge=2)
    dataloader_start_methods: list[str] = Field(default_factory=lambda: ["fork", "spawn"])
