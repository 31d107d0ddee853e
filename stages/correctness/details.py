"""The correctness stage's `details`: its child runs and each check's record.

The stage builds them (`traingate.stages.correctness.stage`) and hands them back as
`as_json()` inside its StageOutcome, so report.json keeps plain JSON; the renderer validates
them again (the generic `reports/templates/stage.md.j2` shows none of them). A field with a default is one a record holds only once its check got that far:
left unset, it is left out of report.json. A report built without the stage's details (the
stage was skipped) renders without them.

Records the probes sent and the details show as sent (a site, an optimizer) are their payload
models (the stage's `probe/payloads.py`). A float that may be NaN or infinite is `float | None`:
report.json writes it as null.
"""

from __future__ import annotations

from typing import Literal

from traingate.pipeline.model.details import Detail
from traingate.pipeline.model.details import SessionDetails
from traingate.stages.contract.payloads.base import Site
from traingate.stages.correctness.probe.payloads import EvaluationCheck, FactsStep, InputKind, LossFunction, MatrixRows, ModuleChange, OptimizerRecord


class CheckNote(Detail):
    """A check that did not run: not configured, or the stage stopped before it (why)."""

    ran: bool  # always false
    note: str


class NotApplicable(Detail):
    """A check of the instrumented run with nothing to judge (why)."""

    ran: bool  # always false
    applicable: bool  # always false
    note: str


class CorrectnessRun(Detail):
    """One child run of the entrypoint, as the report lists it."""

    label: str
    purpose: str
    kwargs: dict[str, int]  # the keyword arguments it overrode (the gradient-accumulation runs' sizes)
    duration_s: float
    outcome: str  # "returned", or what went wrong in a few words


# -- the instrumented run ------------------------------------------------------------------


class LoaderRow(Detail):
    """A DataLoader that fed the optimizer steps (`LoaderOrdering`, its site resolved)."""

    site: Site | None
    epochs: int
    batches: int
    steps: int
    sampler: str
    sampler_module: str
    batch_sampler: str | None
    sampler_shuffles: bool
    set_epoch_calls: int
    length: int | None
    iterable_dataset: bool


class Observed(Detail):
    """What the instrumented run was seen doing."""

    steps: int
    optimizers: list[OptimizerRecord]
    modules: int
    backward_calls: int
    loaders: list[LoaderRow]


class StaleCheck(Detail):
    ran: bool  # always true
    applicable: bool  # always true
    steps_judged: int
    steps_stale: int
    largest_carried_share: float


class ModesCheck(Detail):
    ran: bool  # always true
    applicable: bool  # always true
    dependent_modules: int
    classes: list[str]
    eval_while_training: int
    train_under_no_grad: int
    frozen_on_purpose: int
    library_calls: int
    loss_target_forwards: int = 0  # no-grad forwards in train mode whose outputs fed the step's loss (not judged)
    functional_dropout: int = 0  # lines calling a functional dropout with training at its default inside a module in eval mode


class LossLine(Detail):
    function: LossFunction
    site: Site | None
    kind: InputKind | Literal["mixed"]  # "mixed": the sampled calls differ
    sampled: int
    rows: int


class LossInputsNotApplicable(Detail):
    ran: bool  # always false
    applicable: bool  # always false
    note: str
    calls: int


class LossInputsCheck(Detail):
    ran: bool  # always true
    applicable: bool  # always true
    calls: int
    lines: list[LossLine]
    mismatches: int
    shape_calls: int = 0  # calls of the element-wise losses (checked for shapes)
    shape_mismatches: int = 0


class MixingCheck(Detail):
    ran: bool  # always true
    applicable: bool  # always true
    model: str | None
    batch_size: int | None
    batch_dim: int | None
    batch_dim_assumed: bool | None
    samples_judged: list[int]
    mixed: bool
    site: Site | None  # the line that called the model


# -- the opt-in runs -----------------------------------------------------------------------


class AccumulationCheck(Detail):
    ran: bool  # always true
    accumulation_kwarg: str
    batch_size_kwarg: str
    accumulation: int  # k
    batch_size: int  # b
    relative_difference: float
    gradient_norm_ratio: float
    update_norm_ratio: float | None
    parameters: int
    tolerance: float
    backward_calls_before_step: int | None


class OverfitCheck(Detail):
    ran: bool  # a reduction was measured
    steps: int
    limit: int
    reduction: float | None
    required: float
    first_loss: float | None
    last_losses: list[float | None]
    note: str | None


class RankRow(Detail):
    rank: int
    ending: str
    duration_s: float | None


class RankLoaderRow(Detail):
    sampler: str
    steps: int
    batches: int


class DistributedCheck(Detail):
    """The run under torchrun: its settings, then how the launch went once it handed back a
    result, then (`ran`) what the ranks' payloads compared."""

    ran: bool
    nproc: int
    backend: str
    timeout_s: float
    start_method: str | None = None
    duration_s: float | None = None
    ranks: list[RankRow] | None = None
    steps_per_rank: list[int] | None = None
    ddp_wrapped: bool | None = None
    tensors_compared: int | None = None
    parameters_differing: int | None = None
    loaders: list[RankLoaderRow] | None = None
    findings: int | None = None


class LossInputFact(Detail):
    """What one classification loss called from one line was given (its first call's input)."""

    function: LossFunction
    kind: InputKind | Literal["mixed"]
    shape: list[int]
    dtype: str


class TrainingFacts(Detail):
    """How the instrumented run trained, kept for a later version's comparison
    (docs/baseline-comparison.md)."""

    steps: int
    losses: list[float | None]  # the loss of each optimizer step (the first 500)
    records: list[FactsStep]  # per step: each group's lr, gradient norm, relative parameter change
    copied: bool  # false: the parameters were too large to copy, no changes recorded
    modules: list[ModuleChange]  # each top-level module's relative change over the run
    matrices: list[MatrixRows]  # the distinct rows of each weight matrix at the end
    # Left out where not observed (and in an older gate's baseline):
    samples_per_epoch: int | None = None  # samples the loaders that drove steps handed out per epoch
    loss_inputs: list[LossInputFact] | None = None  # what each classification loss was given
    evaluation: EvaluationCheck | None = None  # forwards under no_grad run twice: the same output?

    def loss_chart(self, baseline: list[float | None] | None = None) -> LossChart | None:
        """What the stage's page draws (`loss_chart`)."""
        return loss_chart(self.losses, baseline)


class BaselineFactsCheck(Detail):
    """This run's training facts against the baseline's (`training-regression`)."""

    ran: bool
    note: str | None
    compared: list[str]  # the facts compared
    regressions: list[str]  # each stated in a finding (a loss that stopped falling in the nearer cause's, where there is one)
    changed_not_worse: list[str]
    baseline_losses: list[float | None] = []  # the baseline's loss per step, drawn beside this run's


class LossChart(Detail):
    """The loss per optimizer step of this run (and of the baseline), at the same steps."""

    steps: list[int]
    now: list[float]
    baseline: list[float] | None


def loss_chart(now: list[float | None], baseline: list[float | None] | None, most: int = 60) -> LossChart | None:
    """At most `most` steps, evenly spaced over the steps both runs made (all of this run's
    without a baseline); a step whose loss is not a number takes the one before it. None when
    fewer than two steps have a loss."""
    length = min(len(now), len(baseline)) if baseline else len(now)
    if sum(1 for v in now[:length] if v is not None) < 2:
        return None
    picked = sorted({round(i * (length - 1) / (most - 1)) for i in range(most)}) if length > most else list(range(length))

    def held(values: list[float | None]) -> list[float]:
        last = next(v for v in values if v is not None)
        out = []
        for v in values:
            last = v if v is not None else last
            out.append(last)
        return [round(out[i], 6) for i in picked]

    shown = baseline if baseline and any(v is not None for v in baseline[:length]) else None
    return LossChart(steps=[i + 1 for i in picked], now=held(now[:length]), baseline=held(shown[:length]) if shown else None)


class CorrectnessChecks(Detail):
    stale_gradients: StaleCheck | NotApplicable | CheckNote
    train_eval_mode: ModesCheck | NotApplicable | CheckNote
    loss_input_mismatch: LossInputsCheck | LossInputsNotApplicable | CheckNote
    batch_mixing: MixingCheck | NotApplicable | CheckNote
    observed: Observed | None = None  # left out when the instrumented run handed back nothing to read
    grad_accumulation: AccumulationCheck | CheckNote
    overfit: OverfitCheck | CheckNote
    distributed: DistributedCheck | CheckNote
    training_facts: TrainingFacts | None = None  # left out when the instrumented run handed back none
    baseline: BaselineFactsCheck | None = None  # left out without a --baseline


class CorrectnessDetails(SessionDetails[CorrectnessRun, CorrectnessChecks]):
    """The correctness stage's details: the session's envelope over its runs and checks."""
