"""Payloads of the correctness stage's instruments (`stages/correctness/probe/`).

Every probe interns the target's lines in its own table (`sites`, a list of `Site`); the
records refer to a line by its index there, `None` where no frame of the target was on the
stack. Non-finite floats are sent as their repr ("nan", "inf", "-inf") where the analyses
tell them apart from numbers; elsewhere they stay floats, and reach the stage as None: the
parent reads the payloads from the harness result dumped to JSON types, which has no spelling
for them (`NonFiniteFloat`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field

from ...contract.payloads.base import Payload, Site

# The stage's instruments: `module:factory` specs the entrypoint harness resolves in the target's process.
# This package under the name it runs as (the gate's own, or a run's copy: docs/edited-tests.md).
_PROBES = __name__.rpartition(".")[0]
CORRECTNESS_STEPS = f"{_PROBES}.steps:StepWatch"
CORRECTNESS_LOSSES = f"{_PROBES}.losses:LossWatch"
CORRECTNESS_LOADERS = f"{_PROBES}.loaders:LoaderWatch"
CORRECTNESS_FIRST_UPDATE = f"{_PROBES}.update:FirstUpdate"
CORRECTNESS_ONE_BATCH = f"{_PROBES}.overfit:OneBatch"
CORRECTNESS_RANKS = f"{_PROBES}.ranks:RankWatch"
CORRECTNESS_GRADIENTS = f"{_PROBES}.gradients:StaleGradientWatch"
CORRECTNESS_MODES = f"{_PROBES}.modes:ModeWatch"
CORRECTNESS_LOSS_INPUTS = f"{_PROBES}.loss_inputs:LossInputWatch"
CORRECTNESS_MIXING = f"{_PROBES}.mixing:BatchMixingWatch"
CORRECTNESS_FACTS = f"{_PROBES}.facts:FactsWatch"
# Not an instrument: what the entrypoint harness calls to launch a distributed run's ranks.
CORRECTNESS_LAUNCHER = f"{_PROBES}.distributed:launch"

# How `_value`/`_values` in the probes write a loss or a tensor element that is not finite.
NonFiniteRepr = Literal["nan", "inf", "-inf"]
# A BLAKE2b digest of 16 bytes, in hex (`probe.ranks._tensor_digest`, `_batch_digest`).
Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
# A float the probe writes as it is, NaN and inf included: None once the parent has it.
NonFiniteFloat = float | None


# -- CORRECTNESS_STEPS --------------------------------------------------------------------------


class OptimizerGroup(Payload):
    lr: float | None  # None: the group's lr is not a number
    params: int


class OptimizerRecord(Payload):
    class_: str = Field(alias="class")
    groups: list[OptimizerGroup]
    site: int | None = None  # the line that built it (an index into the payload's sites); None where not seen
    modules: list[str] = Field(default_factory=list)  # `Root:module.path` of its parameters' modules, distinct


class SchedulerRecord(Payload):
    class_: str = Field(alias="class")
    site: int | None
    step_site: int | None = None  # its latest `step()` before this optimizer step; absent if none was seen


# Why an ineffective step changed nothing (`probe.causes`).
StepCause = Literal["frozen", "zero-lr", "cleared", "no-gradient", "no-backward", "unexplained"]


class IneffectiveStep(Payload):
    """An optimizer step after which no parameter of its groups changed."""

    step: int
    optimizer: int  # index into `optimizers`
    site: int | None
    lrs: list[float | None]  # one per group
    schedulers: list[SchedulerRecord]  # those built around this optimizer
    grads_present: int
    params: int
    # Absent in a record written without `probe.causes` (a unit test's bare watch).
    cause: StepCause | None = None
    backward_site: int | None = None  # the latest backward before the step (cleared, no-gradient)
    grads_after_backward: int | None = None  # parameters holding a gradient once it returned; None: not counted
    clear_site: int | None = None  # the `zero_grad()` after that backward (cleared)
    clear_call: Literal["Optimizer.zero_grad", "Module.zero_grad"] | None = None
    frozen: list[str | None] | None = None  # the first frozen parameters' names (frozen)


class StepSite(Payload):
    site: int  # only steps made from a line of the target are counted by line
    steps: int


class ParameterDescription(Payload):
    """A parameter, named in the root module that holds it; all None but its shape when no
    module the run constructed holds it."""

    name: str | None
    root: str | None
    root_site: int | None
    module: str | None
    site: int | None
    shape: list[int]


class GroupParameter(ParameterDescription):
    """A parameter of an optimizer group."""

    optimizer: int
    group: int
    lr: float | None
    # In `no_gradient`: whether the module holding it ran a forward in the run.
    forward_ran: bool | None = None
    # In `no_gradient`, where its module was watched once a step found it without a gradient
    # (`probe.cuts`): whether it then ran a forward with gradients recorded, and the cut seen
    # between its output and the loss (None: none, its output reached no loss).
    watched_forward: bool | None = None
    cut: Literal["detach", "data", "no_grad"] | None = None
    cut_site: int | None = None


class ClipRecord(Payload):
    """Optimizer steps whose gradients were not the ones a clip on one line clipped (`probe.clipping`)."""

    function: Literal["clip_grad_norm_", "clip_grad_value_"]
    site: int | None  # the clip's line
    # before-backward: it ran before the backward of the coming step (on cleared or old gradients);
    # backward-after-clip: a later backward added to the gradients it clipped.
    kind: Literal["before-backward", "backward-after-clip"]
    backward_site: int | None  # the latest backward before the step, which the clip should follow
    first_step: int
    steps: int
    step_indexes: list[int]


class StepsPayload(Payload):
    """`probe.steps.StepWatch`; read by `correctness.ineffective`, `unused`, `nonfinite`,
    `located` and the stage's observed counts."""

    steps: int
    optimizers: list[OptimizerRecord]
    ineffective: list[IneffectiveStep]  # the first MAX_STEP_RECORDS
    ineffective_count: int
    step_sites: list[StepSite]
    not_in_optimizer: list[ParameterDescription]  # the first MAX_NAMED of each list, `*_count` all
    not_in_optimizer_count: int
    no_gradient: list[GroupParameter]
    no_gradient_count: int
    never_changed: list[GroupParameter]
    never_changed_count: int
    modules_seen: int
    clip_calls: int = 0  # calls of clip_grad_norm_ / clip_grad_value_
    clips: list[ClipRecord] = Field(default_factory=list)
    non_finite_params: list[str]
    sites: list[Site]


# -- CORRECTNESS_LOSSES -------------------------------------------------------------------------


class FirstNonFinite(Payload):
    call: int  # index of the backward call
    step: int  # optimizer steps before it
    site: int | None
    value: NonFiniteRepr


class LossesPayload(Payload):
    """`probe.losses.LossWatch`; read by `correctness.nonfinite`, `overfit`, `accumulation`
    and the stage's observed counts."""

    calls: int
    dropped: int  # backward calls past MAX_CALLS, not kept
    steps: int
    non_finite: int
    first_non_finite: FirstNonFinite | None
    first_finite: list[float] = Field(max_length=1)  # the first finite loss, when there is one
    last_non_finite: bool
    # Each backward call's loss (the first 2000); None where the loss could not be read.
    losses: list[float | NonFiniteRepr | None]
    steps_of_calls: list[int]  # optimizer steps before each of those calls
    backward_sites: list[int]
    sites: list[Site]


# -- CORRECTNESS_LOADERS ------------------------------------------------------------------------


class LoaderOrdering(Payload):
    """A DataLoader the run built (`probe.loaders.LoaderWatch` plus its `_ordering`)."""

    site: int | None
    epochs: int
    batches: int
    steps: int  # optimizer steps made while its batch was the latest handed out
    sampler: str  # the class of the sampler that orders the indexes
    sampler_module: str
    batch_sampler: str | None
    sampler_shuffles: bool
    set_epoch_calls: int
    length: int | None  # None: a loader without a length (an iterable dataset)
    iterable_dataset: bool
    samples: int = 0  # samples handed out: the first dimension of each batch's first tensor, summed


class LoaderOverlap(Payload):
    """Samples an evaluation loader (no optimizer step) handed out that a training loader also did."""

    trained: int  # index into `loaders`
    evaluated: int
    overlap: int  # distinct samples both handed out
    evaluated_samples: int  # distinct samples the evaluation loader handed out
    trained_samples: int


class LoadersPayload(Payload):
    """`probe.loaders.LoaderWatch`; read by `correctness.shuffling`, `leakage` and the stage's
    observed loaders."""

    loaders: list[LoaderOrdering]
    overlaps: list[LoaderOverlap] = Field(default_factory=list)
    sites: list[Site]


# -- CORRECTNESS_FIRST_UPDATE -------------------------------------------------------------------


class ParameterUpdate(Payload):
    """One parameter at the first optimizer step, in group order."""

    group: int
    numel: int
    grad_norm: float | None  # None: the parameter had no gradient
    grad_sample: list[NonFiniteFloat] | None
    # Written after step() returned; absent when the run ended inside it (`stepped` is false).
    update_norm: float | None = None
    update_sample: list[NonFiniteFloat] | None = None


class FirstUpdatePayload(Payload):
    """`probe.update.FirstUpdate`; read by the stage and `correctness.accumulation`."""

    stepped: bool
    params: list[ParameterUpdate]
    stop: Literal["FirstStepReached"]  # the BaseException that ends the run after the step


# -- CORRECTNESS_ONE_BATCH ----------------------------------------------------------------------


class OneBatchPayload(Payload):
    """`probe.overfit.OneBatch`; read by the stage's one-batch overfit check."""

    steps: int
    limit: int  # 0: not limited
    loaders: int  # datasets whose first batch is repeated
    batches_repeated: int
    stop: Literal["OverfitStepsDone"]


# -- CORRECTNESS_RANKS --------------------------------------------------------------------------


class RankTensor(Payload):
    """A parameter or buffer of a root module at the end of one rank's run."""

    name: str  # `Root[i].qualified.name`, the same on every rank
    kind: Literal["parameter", "buffer"]
    module: str
    site: int | None  # where the root module was built
    module_site: int | None  # where the module holding it was built
    in_ddp: bool
    shape: list[int]
    digest: Digest
    values: list[float | NonFiniteRepr]  # empty for a complex tensor
    sampled: bool  # `values` are evenly spaced samples, not every element
    numel: int


class DdpWrapper(Payload):
    site: int | None
    module: str  # the class of the wrapped module
    broadcast_buffers: bool


class SeedCall(Payload):
    site: int  # only calls from a line of the target are kept
    seed: int


class RankLoader(Payload):
    site: int | None
    sampler: str
    batches: int
    steps: int
    digests: list[Digest]  # of the first MAX_BATCHES batches


class RanksPayload(Payload):
    """`probe.ranks.RankWatch` in one rank of a distributed run; read by
    `correctness.divergence` and the stage's distributed check."""

    steps: int
    tensors: list[RankTensor]
    initial: dict[str, Digest]  # parameter name -> digest before the first step; empty without a step
    ddp: list[DdpWrapper]
    seeds: list[SeedCall]
    loaders: list[RankLoader]
    sites: list[Site]


# -- CORRECTNESS_GRADIENTS ----------------------------------------------------------------------


class StaleStep(Payload):
    """An optimizer step that applied gradient carried over from before its previous step."""

    step: int
    optimizer: int  # in the order the optimizers first stepped
    site: int | None  # the step's line
    backward_site: int | None  # the first backward call after the previous step
    carried_norm: float | None  # None: not finite
    applied_norm: float | None
    carried_share: float | None  # carried_norm / applied_norm; None where undefined
    params_carrying: int  # parameters whose gradient was never cleared since the previous step
    params: int


class ClearSite(Payload):
    """A line that called `zero_grad()`, and how many times (`probe.clears`)."""

    site: int | None
    calls: int


class DiscardSite(Payload):
    """A line whose `zero_grad()` cleared gradients no optimizer step had used (`probe.clears`)."""

    site: int | None
    call: str  # "Optimizer.zero_grad" or "Module.zero_grad"
    backwards: int  # backward calls whose gradients it discarded
    clears: int  # its calls that discarded some


class GradientsPayload(Payload):
    """`probe.gradients.StaleGradientWatch`; read by `correctness.stale` and `correctness.discarded`."""

    steps: int
    judged: int  # steps with a backward call since the optimizer's previous step
    dropped: int  # steps not judged: past MAX_STEP_RECORDS, or after more than MAX_BACKWARDS backward calls
    stale: list[StaleStep]  # the first MAX_LISTED
    stale_count: int
    largest_share: float
    sites: list[Site]
    backward_calls: int = 0
    clear_sites: list[ClearSite] = Field(default_factory=list)
    discarded: list[DiscardSite] = Field(default_factory=list)


# -- CORRECTNESS_MODES --------------------------------------------------------------------------


class ModeModule(Payload):
    name: str  # qualified in the model called, or the class where it is unknown
    class_: str = Field(alias="class")
    kind: Literal["dropout", "norm"]  # norm: a norm layer tracking running statistics


class EvalWhileTraining(Payload):
    """Optimizer steps whose forward ran mode-dependent modules in eval mode."""

    site: int | None  # the line that called the model
    root: str | None  # the class of the model called
    modules: list[ModeModule]
    first_step: int
    steps: int
    step_indexes: list[int]
    step_site: int | None
    eval_site: int | None  # the `eval()`/`train(False)` call that left the model in eval mode


class TrainUnderNoGrad(Payload):
    """Forward calls under no_grad/inference_mode with mode-dependent modules in train mode."""

    site: int | None
    root: str | None
    modules: list[ModeModule]
    first_step: int  # optimizer steps before the first of them
    forwards: int  # module forward calls
    inference_mode: bool


class FunctionalDropout(Payload):
    """A functional dropout called with `training` at its default (True) from the forward of a
    module in eval mode."""

    site: int | None  # the line that called it
    function: Literal["dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout"]
    p: float
    module: str  # the class of the module in eval mode whose forward called it
    calls: int
    first_step: int  # optimizer steps before the first such call


class ModesPayload(Payload):
    """`probe.modes.ModeWatch`; read by `correctness.modes`."""

    steps: int
    dependent_modules: int  # mode-dependent modules that ran a forward
    classes: list[str]
    eval_while_training: list[EvalWhileTraining]
    train_under_no_grad: list[TrainUnderNoGrad]
    frozen_on_purpose: int
    library_calls: int
    # No-grad forwards in train mode whose outputs fed the same step's loss (a target or EMA network): training.
    loss_target_forwards: int = 0
    functional_dropout: list[FunctionalDropout] = Field(default_factory=list)
    sites: list[Site]


# -- CORRECTNESS_LOSS_INPUTS --------------------------------------------------------------------

LossFunction = Literal["cross_entropy", "nll_loss", "binary_cross_entropy_with_logits"]
InputKind = Literal["probabilities", "log-probabilities", "logits", "other", "unit-interval", "empty"]


class LossInputSite(Payload):
    """The sampled inputs of one loss function called from one line of the target."""

    function: LossFunction
    site: int | None  # the line that called the loss
    calls: int
    sampled: int  # calls whose input was sampled
    rows: int  # rows (elements for the binary loss) judged
    kind: InputKind | Literal["mixed"]  # "mixed": the sampled calls differ
    kinds: list[InputKind]
    producer: str | None  # the autograd node behind the views, e.g. "SoftmaxBackward0"
    module: str | None  # the class of the Softmax/LogSoftmax/Sigmoid module whose output it is
    module_site: int | None  # the line that called that module
    producer_site: int | None = None  # the line that called the functional op behind it (`F.softmax`), where seen
    gradients_recorded: bool
    example: list[NonFiniteFloat]  # the first sampled values; not finite where `kind` is "empty"
    shape: list[int] = Field(default_factory=list)  # the first call's input shape
    dtype: str = ""  # the first call's input dtype, e.g. "float32"


ShapeLossFunction = Literal["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy", "binary_cross_entropy_with_logits", "log_prob"]


class LossShapeSite(Payload):
    """An element-wise loss called from one line with an input and a target whose shapes differ
    and broadcast beyond the input's (the first such call's shapes)."""

    function: ShapeLossFunction
    site: int | None
    calls: int  # calls from that line
    mismatched: int  # of them, broadcasting the input
    input_shape: list[int]
    target_shape: list[int]
    broadcast_shape: list[int]
    gradients_recorded: bool
    # "log_prob": the class of the `torch.distributions` distribution; its batch shape is `input_shape`, the values `target_shape`.
    distribution: str | None = None


class FrozenOutput(Payload):
    """A training loss given the output of a layer the target built, at its initialisation,
    with no parameter that trains (`probe.frozen_output`)."""

    function: str  # the loss function
    site: int | None  # the loss call
    module: str  # the class of the layer
    module_site: int | None  # where the target built it
    frozen_site: int | None  # the `requires_grad_(False)` or `requires_grad = False` that froze it, where one was seen
    params: int


class LossInputsPayload(Payload):
    """`probe.loss_inputs.LossInputWatch`; read by `correctness.loss_inputs`."""

    calls: int
    losses: list[LossInputSite]
    shape_calls: int = 0  # calls of the element-wise losses
    shapes: list[LossShapeSite] = Field(default_factory=list)
    frozen_outputs: list[FrozenOutput] = Field(default_factory=list)
    sites: list[Site]


# -- CORRECTNESS_MIXING -------------------------------------------------------------------------


class SampleDependency(Payload):
    sample: int
    others: list[int]  # the first of the other samples its outputs depend on
    others_count: int
    own_gradient: NonFiniteFloat
    largest_other_gradient: NonFiniteFloat


class TracedOp(Payload):
    name: str
    site: int | None
    shape: list[int]
    index: int  # in the order the forward ran its ops


class MixingPayload(Payload):
    """`probe.mixing.BatchMixingWatch`; read by `correctness.mixing`. Without `applicable`, the
    rest is absent and `reason` says why."""

    # In the order the probe writes them: the payload is this model's dump (`Payload.sent`).
    steps: int
    captured: int
    site: int | None  # the line that called the model
    model: str | None = None
    batch_size: int | None = None
    batch_dim: int | None = None
    batch_dim_assumed: bool | None = None
    applicable: bool
    reason: str | None = None
    outputs: int | None = None
    pairwise_output: bool | None = None
    samples: list[SampleDependency] = Field(default_factory=list)
    pair: list[int] | None = None
    ops_traced: int | None = None
    mixing_op: TracedOp | None = None
    layout_op: TracedOp | None = None
    locate_error: str | None = None
    sites: list[Site]

MODELS: dict[str, type[BaseModel]] = {
    CORRECTNESS_STEPS: StepsPayload,
    CORRECTNESS_LOSSES: LossesPayload,
    CORRECTNESS_LOADERS: LoadersPayload,
    CORRECTNESS_FIRST_UPDATE: FirstUpdatePayload,
    CORRECTNESS_ONE_BATCH: OneBatchPayload,
    CORRECTNESS_RANKS: RanksPayload,
    CORRECTNESS_GRADIENTS: GradientsPayload,
    CORRECTNESS_MODES: ModesPayload,
    CORRECTNESS_LOSS_INPUTS: LossInputsPayload,
    CORRECTNESS_MIXING: MixingPayload,
}


# -- CORRECTNESS_FACTS --------------------------------------------------------------------------


class FactsStep(Payload):
    """One optimizer step: each group's learning rate, gradient norm and relative change."""

    step: int
    optimizer: int
    lrs: list[float | None]
    grad_norms: list[NonFiniteFloat | None]
    changes: list[NonFiniteFloat | None]  # None: not recorded (the parameters were too large to copy) or undefined


class ModuleChange(Payload):
    module: str  # the top-level child's name in its root module ("" for the root's own parameters)
    change: NonFiniteFloat | None  # ||end - first step|| / ||first step||


class MatrixRows(Payload):
    name: str
    rows: int
    distinct: int
    init_site: int | None  # the line of the latest torch.nn.init call on it; None: none seen


class EvaluationCheck(Payload):
    """Forward calls of a model under no_grad, each run a second time on the same input with the
    same random state: whether both gave the same output."""

    checked: int
    deterministic: int  # of them, the same output twice
    eval_mode: int  # of them, with the model in eval mode
    site: int | None  # the line that called the model in the first check that differed, else in the first check


class FactsPayload(Payload):
    """`probe.facts.FactsWatch`; read by `correctness.baseline`."""

    steps: int
    records: list[FactsStep]  # the first MAX_STEPS
    copied: bool  # false: the parameters were too large to copy, no changes recorded
    modules: list[ModuleChange]
    matrices: list[MatrixRows]
    scheduler_sites: list[StepSite]  # the lines that called a scheduler's step(), with their calls
    evaluation: EvaluationCheck | None = None  # None: no forward under no_grad was seen
    sites: list[Site]


MODELS[CORRECTNESS_FACTS] = FactsPayload
