"""Payloads of the concurrency stage's instruments.

The probes live in `stages/concurrency/probe/`; the analyses that read them in
`stages/concurrency/` (protocol, determinism, loaders, cuda). The parameter
fingerprints (`probe/params.py`) are not an instrument of their own: both loss recorders hand
them back under `params`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, Field, StrictFloat, StringConstraints, model_validator

from ...contract.payloads.base import Payload, Site

# The stage's instruments: `module:factory` specs the entrypoint harness resolves in the target's process.
# This package under the name it runs as (the gate's own, or a run's copy: docs/edited-tests.md).
_PROBES = __name__.rpartition(".")[0]
CONCURRENCY_TRACE = f"{_PROBES}.trace:ProtocolTrace"
CONCURRENCY_LOSSES = f"{_PROBES}.trace:LossTrace"
CONCURRENCY_RNG = f"{_PROBES}.rng:RngSites"
CONCURRENCY_LOADERS = f"{_PROBES}.loaders:LoaderWatch"
CONCURRENCY_NONBLOCKING = f"{_PROBES}.cuda:NonBlockingWatch"
CONCURRENCY_STREAMS = f"{_PROBES}.cuda:StreamSanitizer"


# -- the loss per optimizer step and the parameters after it (probe/trace.py, probe/params.py) --

# (float64 sum, L2 norm) of a parameter, or summed over a param group. Strict, like the losses:
# the determinism check compares values with their types, and the probe writes only floats.
# None: a non-finite float as the stage reads it. The probe writes NaN and infinity, but the
# stage keeps the harness result as JSON (`base.run_entrypoint`), which turns them into null.
Fingerprint = tuple[StrictFloat | None, StrictFloat | None]
# A loss that `.item()` could not read is kept as the reason, so the two runs still compare.
UnreadableLoss = Annotated[str, StringConstraints(pattern=r"^unreadable: ")]


class ParamStep(Payload):
    """The parameters of one optimizer after one of its steps."""

    optimizer: int  # index into `ParamFingerprints.names`
    groups: list[Fingerprint]  # one per non-empty param group
    # One per parameter (capped), only for the first `detailed_steps` steps.
    params: list[Fingerprint] | None = None


class ParamFingerprints(Payload):
    """`probe.params.ParamFingerprints`, under `params` of both loss recorders; the
    determinism comparison (`determinism.compare`) reads `steps` and `names`."""

    steps: list[ParamStep]
    names: list[list[str]]  # per optimizer, a name per parameter (capped)
    group_sizes: list[list[int]]  # per optimizer, parameters per group at its first step
    detailed_steps: int
    dropped: int  # steps past the cap, not fingerprinted


class LossTracePayload(Payload):
    """`probe.trace.LossTrace` (CONCURRENCY_LOSSES): what the determinism reruns compare
    (`stage._recorded`)."""

    # Per optimizer step, every backward since the previous one (None: non-finite, as for `Fingerprint`).
    losses: list[list[StrictFloat | UnreadableLoss | None]]
    steps: int
    truncated: bool  # more steps than `losses` holds
    params: ParamFingerprints


# -- the GradScaler protocol (probe/trace.py) ----------------------------------------------------
# One record per call, `site` an index into the payload's `sites` (None: no target frame).


class ScaleEvent(Payload):
    op: Literal["scale"]
    site: int | None
    scaler: int
    enabled: bool


class UnscaleEvent(Payload):
    op: Literal["unscale_"]
    site: int | None
    scaler: int
    opt: int
    enabled: bool


class ScalerStepEvent(Payload):
    op: Literal["scaler.step"]
    site: int | None
    scaler: int
    opt: int
    enabled: bool
    stepped: bool  # the optimizer actually stepped (False: skipped on inf/NaN gradients)


class UpdateEvent(Payload):
    op: Literal["update"]
    site: int | None
    scaler: int
    enabled: bool


class BackwardEvent(Payload):
    op: Literal["backward"]
    site: int | None
    scaled_by: int | None  # the scaler whose output backward ran on


class OptimizerStepEvent(Payload):
    op: Literal["optimizer.step"]
    site: int | None
    opt: int
    via_scaler: bool  # made by scaler.step itself
    closure: bool
    grads: bool  # any parameter had a gradient


class ZeroGradEvent(Payload):
    """`optimizer.zero_grad()` (`opt`) or `module.zero_grad()` (`module`, its class name)."""

    op: Literal["zero_grad"]
    site: int | None
    opt: int | None = None
    module: str | None = None

    @model_validator(mode="after")
    def _one_owner(self) -> ZeroGradEvent:
        if (self.opt is None) == (self.module is None):
            raise ValueError("a zero_grad event names exactly one of opt and module")
        return self


class AutogradGradEvent(Payload):
    op: Literal["autograd.grad"]
    site: int | None


class ClipEvent(Payload):
    op: Literal["clip"]
    site: int | None
    fn: Literal["clip_grad_norm_", "clip_grad_value_", "clip_grad_norm"]
    opts: list[int]  # the optimizers owning any clipped parameter


ProtocolEvent = Annotated[
    ScaleEvent | UnscaleEvent | ScalerStepEvent | UpdateEvent | BackwardEvent | OptimizerStepEvent | ZeroGradEvent | AutogradGradEvent | ClipEvent,
    Field(discriminator="op"),
]


class ScalerRecord(Payload):
    index: int
    type: str  # the GradScaler's class name
    enabled: bool


class ProtocolTracePayload(LossTracePayload):
    """`probe.trace.ProtocolTrace` (CONCURRENCY_TRACE): the loss recorder's payload and every
    protocol call; read by `protocol.protocol_findings` and, as run 1, by the determinism check."""

    events: list[ProtocolEvent]  # capped; the rest counted in `dropped_events`
    dropped_events: int
    sites: list[Site]
    scalers: list[ScalerRecord]
    optimizers: int


# -- seeding calls (probe/rng.py) ----------------------------------------------------------------

SeedingApi = Literal[
    "torch.manual_seed",
    "torch.seed()",
    "torch.Generator.manual_seed",
    "torch.Generator.seed()",
    "random.seed",
    "random.Random()",
    "numpy.random.seed",
    "numpy.random.default_rng",
    "numpy.random.RandomState()",
]


class SeedingRecord(Payload):
    api: SeedingApi
    # A scalar as given (a bool kept a bool), anything else its repr; None: from entropy.
    seed: bool | int | float | str | None
    entropy: bool
    site: Site  # only the target's own calls are recorded


class RngPayload(Payload):
    """`probe.rng.RngSites` (CONCURRENCY_RNG): read by `determinism.rng_causes` and, for the
    hash-order hints, `stage._hash_order` (`target_modules`)."""

    records: list[SeedingRecord]  # capped
    target_modules: list[str]  # the target's modules imported by the run, relative paths


# -- DataLoaders (probe/loaders.py) --------------------------------------------------------------

WorkerErrorKind = Literal["worker-died", "worker-timeout", "worker-exception", "other"]
# The settings a failed construction was given (only those it was given); a value that is not
# a scalar is kept as its repr.
GivenSetting = Literal["num_workers", "batch_size", "persistent_workers", "prefetch_factor", "pin_memory", "timeout", "multiprocessing_context", "shuffle"]


class LoaderSettings(Payload):
    num_workers: int
    batch_size: int | None
    sampler: str  # class names from here on
    persistent_workers: bool
    prefetch_factor: int | None
    pin_memory: bool
    timeout: int | float  # as the loader holds it: DataLoader's default is the int 0
    multiprocessing_context: str | None  # the start method the loader was given
    start_method: str | None  # the one its workers used; None without workers
    generator: Literal["given"] | None
    dataset: str
    collate_fn: str | None
    worker_init_fn: str | None


class LoaderRecord(Payload):
    """Every construction of a DataLoader at one target line."""

    site: Site | None
    settings: LoaderSettings  # of the first construction
    constructions: int
    iterations: int
    batches: int
    live_workers: list[int]  # live worker processes each time a multi-worker loader started (capped)
    settings_vary: bool


class ConstructionError(Payload):
    site: Site | None
    settings: dict[GivenSetting, bool | int | float | str | None]
    type: str
    message: str


class IterationError(Payload):
    site: Site | None  # the loader's construction line
    settings: LoaderSettings | None
    type: str
    message: str
    kind: WorkerErrorKind
    worker_site: Site | None  # innermost target frame of the worker's traceback


class Culprit(Payload):
    """The innermost part of a loader's input that cannot be pickled."""

    attribute: str  # as a reader would write it: `dataset.transform`
    type: str
    defined_at: Site | None  # where it was defined, when it is a function of the target
    qualname: str | None


class PickleOk(Payload):
    ok: Literal[True]


class PickleFailed(Payload):
    ok: Literal[False]
    object: Literal["dataset", "collate_fn", "worker_init_fn"]
    error: str
    culprit: Culprit | None


class BatchLoaded(Payload):
    ok: Literal[True]
    seconds: float
    empty: bool = False  # present (True) when the dataset had no batch to load
    same_as: Site | None = None  # present when the result is another loader's with the same inputs


class BatchFailed(Payload):
    ok: Literal[False]
    error: str
    kind: WorkerErrorKind
    worker_site: Site | None
    seconds: float
    same_as: Site | None = None
    # Whether the probe's worker had started (its worker_init_fn ran) when the probe gave up;
    # None where not known.
    worker_started: bool | None = None

    @property
    def slow_start(self) -> bool:
        """Timed out before its worker was up: a busy machine's slow start, nothing observed
        of the dataset or the loader."""
        return self.kind == "worker-timeout" and self.worker_started is False


class StartMethodCheck(Payload):
    """One multi-worker loader under a start method the run did not use."""

    site: Site | None
    method: str
    used: str  # the start method of the run's own workers
    pickle: PickleOk | PickleFailed | None = None  # only for methods other than fork
    batch: BatchLoaded | BatchFailed


class LoaderPayload(Payload):
    """`probe.loaders.LoaderWatch` (CONCURRENCY_LOADERS): read by `loaders.loader_findings`,
    `loaders.loader_details` and the summary metrics of `stage._outcome`."""

    loaders: list[LoaderRecord]
    construction_errors: list[ConstructionError]
    errors: list[IterationError]  # capped
    start_method_checks: list[StartMethodCheck]


# -- CUDA only (probe/cuda.py): on a CPU each watch installs nothing and hands back an empty record --


class NonBlockingRace(Payload):
    copy_site: Site | None
    read_site: Site  # reads outside the target are not recorded
    read_by: str  # `.tolist()`, `.numpy()`, `.__array__()`, or the aten op that read it


class NonBlockingPayload(Payload):
    """`probe.cuda.NonBlockingWatch` (CONCURRENCY_NONBLOCKING): read by
    `cuda.nonblocking_observed` and the stage's non_blocking details."""

    available: bool  # CUDA was there, so the watch was installed
    copies: int
    races: list[NonBlockingRace]  # capped

    @model_validator(mode="after")
    def _nothing_without_cuda(self) -> NonBlockingPayload:
        if not self.available and (self.copies or self.races):
            raise ValueError("a non_blocking watch that was not installed observed nothing")
        return self


class StreamReport(Payload):
    """One unsynchronised access CSAN reported."""

    message: str  # CSAN's text, its tail
    site: Site | None
    previous_site: Site | None
    operator: str
    previous_operator: str
    streams: tuple[int | None, int | None]  # CSAN's stream ids: this access's, the previous one's


class StreamPayload(Payload):
    """`probe.cuda.StreamSanitizer` (CONCURRENCY_STREAMS): read by `cuda.stream_findings` and
    the stage's stream details."""

    available: bool
    reports: list[StreamReport]  # capped
    total: int  # every report, past the cap too

    @model_validator(mode="after")
    def _counted(self) -> StreamPayload:
        if not self.available and (self.total or self.reports):
            raise ValueError("a stream sanitizer that was not installed observed nothing")
        if self.total < len(self.reports):
            raise ValueError("total counts every report, so it is at least the number kept")
        return self


MODELS: dict[str, type[BaseModel]] = {
    CONCURRENCY_TRACE: ProtocolTracePayload,
    CONCURRENCY_LOSSES: LossTracePayload,
    CONCURRENCY_RNG: RngPayload,
    CONCURRENCY_LOADERS: LoaderPayload,
    CONCURRENCY_NONBLOCKING: NonBlockingPayload,
    CONCURRENCY_STREAMS: StreamPayload,
}
