"""The base of every instrument payload model."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Payload(BaseModel):
    """What one instrument's `collect()` hands back, or a record inside it. Unknown keys are
    an error, so a probe and the analysis reading it cannot drift apart unnoticed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
