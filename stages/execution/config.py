"""The execution stage's thresholds under `[tool.traingate.policy]` (docs/configuration.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict

from traingate.stages.api import Stricter


class ExecutionPolicy(BaseModel):
    """The execution stage's threshold, a key of `[tool.traingate.policy]`."""

    model_config = ConfigDict(extra="forbid")
    # A test that could not run here (network, missing package): high (blocks) when true,
    # low otherwise; the stage's summary says the suite was incomplete either way.
    test_environment_blocks: Annotated[bool, Stricter.HIGHER] = False
