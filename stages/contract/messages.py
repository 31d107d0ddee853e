"""The requests and results that cross a process boundary, defined once for both sides.

Every model forbids unknown keys: a misspelt key, a missing field or a record of the wrong
shape is a validation error, which the reading side turns into a stage error (fail closed),
never a silent default. Requests reach a child on stdin; results come back over the
channel (`stages/common/channel.py`) inside an envelope that carries the run's nonce.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from ..common.channel import ChannelSpec
from ..common.reads import FilesRead

# Envelope kinds on the channel.
AGENT_REPLY = "agent-reply"
# A stage agent's one notice before its reply: its timed runs are done (`StageContext.machine_released`).
MACHINE_RELEASED = "machine-released"
HARNESS_RESULT = "harness-result"
PYTEST_EVENT = "pytest-event"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- the stage agent (pipeline.orchestrator <-> stages.agent) ------------------------------


# The gate's own models (TargetConfig, PipelineReport, StageOutcome) live in pipeline/,
# which this contract may not import: the envelope names them by type parameters, and both
# ends use it parameterized (`AgentRequest[TargetConfig, PipelineReport]`, `AgentReply[StageOutcome]`).
ConfigT = TypeVar("ConfigT", bound=BaseModel)
BaselineT = TypeVar("BaselineT", bound=BaseModel)
OutcomeT = TypeVar("OutcomeT", bound=BaseModel)


class AgentRequest(Strict, Generic[ConfigT, BaselineT]):
    stage: str
    root: str
    config: ConfigT  # the target's configuration
    device: Literal["cpu", "cuda"]
    deadline: float  # time.time() by which the stage must have returned
    scratch: str
    margin_s: float
    baseline: BaselineT | None  # the --baseline report
    registry: str  # `module:function` building the stage registry
    channel: ChannelSpec
    # The gate started an agents' host for this run (`pipeline/supervision/warm.py: AgentHost`).
    agents_host: bool = False
    # The child-side modules under this run's names (`pipeline/supervision/disguise.py: Disguise`);
    # None: the children run the real modules.
    disguise: dict[str, Any] | None = None
    # The user's tree the stage's root was copied from (it holds the git history the
    # execution stage reads the baseline's tests from); only read, never run from.
    origin: str | None = None
    # The baseline's entrypoint (an `EntrypointConfig` dump), smoke-called on this version as
    # well where the change's entrypoint configuration differs from it; None: nothing more to run.
    baseline_entrypoint: dict[str, Any] | None = None
    # The setup module the configuration names, in the baseline's form (path -> text), where the
    # change edited it: the training is observed with it as well.
    baseline_setup: dict[str, str] = Field(default_factory=dict)


class AgentReply(Strict, Generic[OutcomeT]):
    """Exactly one of: the stage's outcome, or the traceback of the exception the stage raised."""

    outcome: OutcomeT | None = None
    error: str | None = None

    @model_validator(mode="after")
    def _one_of(self) -> AgentReply[OutcomeT]:
        if (self.outcome is None) == (self.error is None):
            raise ValueError("an agent reply holds exactly one of outcome and error")
        return self


# -- one entrypoint call (stages.base.run_entrypoint <-> stages.harness.entrypoint) --------


class DistributedSpec(Strict):
    """Run the entrypoint under torchrun with `nproc` ranks on this machine instead of calling
    it in the harness's own process (`stages/correctness/probe/distributed.py`)."""

    nproc: int = Field(ge=2)
    timeout_s: float = Field(gt=0)  # the whole run, from the launch; past it the ranks still running hang
    backend: Literal["gloo", "nccl"]  # given to an init_process_group call that names none
    # `module:function` that launches the ranks, resolved in the harness as an instrument is (the
    # stage that runs distributed names its own: the harness names no stage).
    launcher: str


class EntrypointRequest(Strict):
    """Exactly one of `call` (module:function or module:Class.method), `script` (a .py
    file relative to the target root, run as `__main__` with `sys.argv = [script, *args]`) and
    `test` (a pytest node id, run by pytest in the harness's process)."""

    target_root: str
    call: str | None
    script: str | None = None
    args: list[str] = Field(default_factory=list)  # the script's arguments, AMP setting included
    setup: str | None
    workdir: str | None = None  # relative to target_root: the folder the training runs in
    prepare: list[list[str]] = Field(default_factory=list)  # scripts run first: [path, *args] each, root-relative
    kwargs: dict[str, Any]
    amp_flag: str | None
    amp: bool | None
    seed: int
    device: Literal["cpu", "cuda"]
    instruments: list[str]  # specs from stages/contract/instruments.py
    instrument_options: dict[str, Any]
    deterministic: bool
    channel: ChannelSpec
    distributed: DistributedSpec | None = None
    max_batches: int | None = None  # the step budget: batches per DataLoader iteration
    max_steps: int | None = None  # the step budget: optimizer steps of the run
    # Or a test whose training is observed: pytest runs `test_args` (the node id and the
    # arguments that pin the run to the target) in the harness's own process.
    test: str | None = None
    test_args: list[str] = Field(default_factory=list)
    # Variables the gate set for the run's runtimes to read at start-up, which the harness takes
    # out of the target's sight once they have (`stages/common/start_env.py`).
    read_at_start: list[str] = Field(default_factory=list)
    # Hand back the models the call left (`HarnessResult.left`): what an unwatched run and the
    # watched ones are compared on (`stages/harness/left.py`).
    leave_digest: bool = False
    # A watched run's progress file (`stages/harness/progress.py`): read if it overruns its budget.
    progress_file: str | None = None

    @model_validator(mode="after")
    def _one_shape(self) -> EntrypointRequest:
        if sum(shape is not None for shape in (self.call, self.script, self.test)) != 1:
            raise ValueError("an entrypoint request names exactly one of call, script and test")
        return self


class TargetFrame(Strict):
    """The innermost frame in the target's own code."""

    path: str  # relative to the target root
    line: int
    function: str
    code: str


class FrameRecord(Strict):
    path: str
    line: int
    function: str


class ExceptionRecord(Strict):
    type: str
    message: str
    traceback: str
    frames: list[FrameRecord]
    target_frame: TargetFrame | None
    # Raised by the gate's own code in the target's process (`stages/harness/faults.py`): the
    # gate's failure, never the target's crash.
    raised_in_gate: bool = False


class WarningRecord(Strict):
    category: str
    message: str
    filename: str
    lineno: int
    target_frame: TargetFrame | None
    count: int = Field(default=1, ge=1)  # how often it was raised from this place in the run


# The key of pydantic's validation context under which a reader of a result gives the payload
# models of its stage's instruments (spec -> model).
MODELS_CONTEXT = "payload_models"


def _check_payloads(value: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
    """Each payload against its model, where the reader gives the models (the parent does, as
    `check_instruments`' validation context; the harness that builds the result does not)."""
    models = info.context.get(MODELS_CONTEXT) if isinstance(info.context, dict) else None
    if not value or not models:
        return value  # nothing to check: a run without instruments never imports the models
    # Imported here: the payload models import this module's neighbours, not the reverse.
    from .payloads import check_instruments

    return check_instruments(value, models)


class CollectiveCall(Strict):
    """A calling line of one of torch.distributed's collectives and how often a rank called it
    there (`stages/correctness/probe/distributed.py`'s counter, counted as each call begins)."""

    function: str  # the collective: all_reduce, barrier, ...
    path: str  # the target's calling line, relative to the target root
    line: int
    target_function: str
    code: str
    calls: int = Field(ge=1)


class RankResult(Strict):
    """One rank of a distributed run, as its worker wrote it (`ok`, `phase`, `exception`,
    `instruments` as in `HarnessResult`) or as the launcher found it (`ending`)."""

    rank: int
    pid: int | None
    # "returned", "raised", "still running at the timeout", "exited with status N before reporting", ...
    ending: str
    reported: bool  # the worker's own record came back (with the run's nonce)
    exit_status: int | None = None  # a rank that died before reporting: its exit status (negative: the signal)
    ok: bool
    phase: Literal["import", "setup", "call"] | None
    exception: ExceptionRecord | None
    duration_s: float | None
    instruments: dict[str, dict[str, Any]] = Field(default_factory=dict)
    stacks: str = ""  # faulthandler's dump of every thread, when the rank was still running at the timeout
    # Its calls of torch.distributed's collectives by calling line: each record is checked
    # against `CollectiveCall` and kept as a dict, the form the launcher reads from the rank's file.
    collectives: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("instruments")
    @classmethod
    def _typed_payloads(cls, value: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
        return _check_payloads(value, info)

    @field_validator("collectives")
    @classmethod
    def _typed_collectives(cls, value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for call in value:
            CollectiveCall.model_validate(call)
        return value


class DistributedRecord(Strict):
    """How the torchrun launch went, and every rank's result, in rank order."""

    nproc: int
    backend: str
    start_method: str
    timeout_s: float
    timed_out: bool  # ranks were still running at the timeout: stacks dumped, every rank killed
    # A rank that failed while others still ran: they were stopped after a grace period.
    stopped_after_failure: int | None = None
    launcher_error: str | None  # the launcher itself failed (not a rank's exception)
    duration_s: float
    ranks: list[RankResult]


class BudgetRecord(Strict):
    """What the step budget did in one run: the limits, and where it stopped the training."""

    max_batches: int | None = None
    max_steps: int | None = None
    steps: int = 0  # optimizer steps taken (the most of any one optimizer)
    stopped_at_steps: bool = False  # the run ended because it reached max_steps
    iterations_cut: int = 0  # DataLoader iterations that ended at max_batches with batches left

    def describe(self) -> str:
        """One sentence for the reports: a controlled stop, never a crash."""
        parts = []
        if self.stopped_at_steps:
            parts.append(f"stopped by the step budget after {self.steps} optimizer steps (max_steps = {self.max_steps})")
        if self.iterations_cut:
            parts.append(f"{self.iterations_cut} DataLoader iteration(s) ended at max_batches = {self.max_batches}")
        return "; ".join(parts) or "the step budget was not reached"


class LeftModel(Strict):
    """A model the call left: a root module alive after it returned, by class and parameter
    count, with a digest of its parameters' values (`stages/harness/left.py`)."""

    model: str
    parameters: int
    digest: str


class HarnessResult(Strict):
    """What the entrypoint harness hands back after the call.

    For a distributed run, `distributed` holds every rank's result; the top-level fields say
    whether every rank returned, and `exception` is the first failing rank's (none when the
    ranks failed without one: a timeout, or a rank that died before reporting).
    """

    ok: bool  # the call returned (the gate also requires exit status 0 and the nonce)
    phase: Literal["import", "setup", "call"]
    exception: ExceptionRecord | None
    returned: Any  # a size-capped, JSON-safe summary of the return value
    returned_truncated: bool = False
    duration_s: float
    warnings: list[WarningRecord]
    warnings_omitted: int = 0
    # spec -> the instrument's collect() result, or {"error": traceback} when it failed.
    instruments: dict[str, dict[str, Any]] = Field(default_factory=dict)
    distributed: DistributedRecord | None = None
    # What the run's processes opened for reading under the target's root (None: not recorded).
    reads: FilesRead | None = None
    budget: BudgetRecord | None = None  # with a step budget configured
    left: list[LeftModel] | None = None  # with `leave_digest`, once the call returned

    @field_validator("instruments")
    @classmethod
    def _typed_payloads(cls, value: dict[str, dict[str, Any]], info: ValidationInfo) -> dict[str, dict[str, Any]]:
        return _check_payloads(value, info)

    @model_validator(mode="after")
    def _consistent(self) -> HarnessResult:
        if self.ok and self.exception is not None:
            raise ValueError("a harness result that is ok holds no exception")
        if not self.ok and self.exception is None and self.distributed is None:
            raise ValueError("a failed harness result holds its exception")
        if self.ok and self.distributed is not None and not all(rank.ok for rank in self.distributed.ranks):
            raise ValueError("a distributed run is ok only when every rank returned")
        return self


# -- the test suite (stages.execution.suite <-> stages.execution.probe.pytest_launcher) ------------


class CoverageSpec(Strict):
    data_file: str
    include: list[str]


class PytestRequest(Strict):
    root: str
    args: list[str]
    coverage: CoverageSpec | None
    channel: ChannelSpec
    read_at_start: list[str] = Field(default_factory=list)  # as `EntrypointRequest.read_at_start`

