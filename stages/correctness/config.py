"""The correctness stage's configuration (docs/configuration.md): its section
`[tool.traingate.correctness]`, its `[tool.traingate.distributed]` run, and its thresholds under
`[tool.traingate.policy]`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from traingate.stages.api import MAX_TIMEOUT_S, Stricter

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


# The key of the distributed run's section: `[tool.traingate.distributed]` (the gate's key before
# sections came from the stages; kept as it was).
DISTRIBUTED = "distributed"
# More ranks than this on one machine is not a check any more but a job.
MAX_NPROC = 8


class DistributedConfig(BaseModel):
    """`[tool.traingate.distributed]`: run the entrypoint under torchrun with `nproc` ranks on
    this machine (gloo on the CPU, NCCL on CUDA, one GPU a rank) and compare the ranks."""

    model_config = _STRICT
    # More ranks, a larger budget verify more: a change that lowers either narrows its verification.
    nproc: Annotated[int, Stricter.HIGHER] = Field(ge=2, le=MAX_NPROC)
    # Seconds the whole distributed run may take; past it, the ranks still running are a `hang`
    # (all ranks' stacks are dumped first). Must leave the stage budget room to report.
    timeout_s: Annotated[float, Stricter.HIGHER] = Field(default=120, gt=0, le=MAX_TIMEOUT_S)

    def over_budget(self, timeout_s: float) -> str | None:
        """Why the distributed run does not fit within the stage's budget; None when it does."""
        if self.timeout_s < timeout_s:
            return None
        return (
            f"distributed.timeout_s ({self.timeout_s:g}) must be below timeout_s ({timeout_s:g}): "
            "the correctness stage runs the entrypoint once on its own first, then the distributed run within the same budget"
        )


class CorrectnessPolicy(BaseModel):
    """The correctness stage's thresholds, keys of `[tool.traingate.policy]`."""

    model_config = _STRICT
    # grad-accumulation: relative difference of the gradient of k accumulated micro-batches
    # from that of one batch k times as large.
    grad_accumulation_tolerance: Annotated[float, Stricter.LOWER] = 0.05
    # no-learning with overfit_steps: the fraction by which the loss must fall on one batch.
    overfit_min_reduction: Annotated[float, Stricter.HIGHER] = 0.5
