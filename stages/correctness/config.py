"""`[tool.traingate.correctness]`: the correctness stage's section of the target's configuration (docs/configuration.md)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class CorrectnessConfig(BaseModel):
    """`[tool.traingate.correctness]`: the opt-in checks that call the entrypoint with other kwargs."""

    model_config = _STRICT
    # The entrypoint's keywords for gradient-accumulation steps and the micro-batch size; with
    # both, one update with `accumulation` micro-batches is compared with one large batch.
    accumulation_kwarg: str | None = None
    batch_size_kwarg: str | None = None
    accumulation: int = Field(default=4, ge=2)
    # The one-batch overfit check: that many optimizer steps on the first batch repeated.
    overfit_steps: int | None = Field(default=None, ge=2)

    @model_validator(mode="after")
    def _both_or_neither(self) -> CorrectnessConfig:
        if (self.accumulation_kwarg is None) != (self.batch_size_kwarg is None):
            raise ValueError("the gradient-accumulation check needs both `accumulation_kwarg` and `batch_size_kwarg`")
        return self
