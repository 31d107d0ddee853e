"""The concurrency stage's `details`: what its report (`report.md.j2` beside this module) shows.

The stage builds them (`traingate.stages.concurrency.stage`) and hands them back as
`as_json()` inside its StageOutcome, so report.json keeps plain JSON; the renderer validates
them again and the template reads the models. A field with a default is
one a record holds only once its check got that far: left unset, it is left out of report.json.
A report built without the stage's details (the stage was skipped) renders without them.

Records the probes sent and the details show as sent (a DataLoader's settings, a site, a
GradScaler) are their payload models (the stage's `probe/payloads.py`).
"""

from __future__ import annotations

from typing import Literal

from traingate.pipeline.model.details import Detail
from traingate.pipeline.model.details import SessionDetails
from traingate.stages.contract.payloads.base import Site
from traingate.stages.concurrency.probe.payloads import LoaderSettings, ScalerRecord


class CheckNote(Detail):
    """A check with nothing to show but a note: one that did not run (`ran` false, and why), or
    the CUDA stream check, whose record is its note."""

    ran: bool
    note: str


class ConcurrencyRun(Detail):
    """One child run of the entrypoint, as the report lists it."""

    label: str
    purpose: str
    hash_seed: str  # its PYTHONHASHSEED
    deterministic: bool  # torch.use_deterministic_algorithms(True)
    duration_s: float
    outcome: str  # "returned", or what went wrong in a few words
    steps: int  # optimizer steps (losses) it recorded


# -- gradscaler-protocol -------------------------------------------------------------------


class ProtocolDetails(Detail):
    ran: bool  # always true
    events: int
    dropped_events: int
    iterations: int
    steps: int
    scalers: list[ScalerRecord]
    sequence_iteration: int | None  # the iteration shown; None without one
    sequence: list[str]  # its calls, one line each
    guarded_skips: int
    guard_note: str | None
    violations: int


# -- dataloader-hazard ---------------------------------------------------------------------


class LoaderRow(Detail):
    site: Site | None
    settings: LoaderSettings
    constructions: int
    iterations: int
    batches: int
    live_workers: list[int]  # the first ten counts


class StartMethodRow(Detail):
    """One loader's dataset loaded by a worker started another way."""

    site: Site | None
    method: str  # the start method tried
    used: str  # the one the run's own workers used
    ok: bool  # a batch was loaded
    pickled: bool
    seconds: float
    error: str | None


class LoaderDetails(Detail):
    ran: bool  # always true
    loaders: list[LoaderRow]
    start_method_checks: list[StartMethodRow]
    errors: int  # construction and worker errors
    start_methods: list[str]  # the configured ones


# -- nonblocking-race ----------------------------------------------------------------------


class SourceMatch(Detail):
    """A non_blocking host copy read before a synchronisation, found in the source."""

    path: str
    line: int
    function: str
    code: str
    detail: str


class NonBlockingDetails(Detail):
    ran: bool  # always true
    mode: Literal["observed", "static"]  # observed at the dispatcher (CUDA), or the source read
    note: str
    static_matches: list[SourceMatch]


# -- nondeterminism ------------------------------------------------------------------------


class CurveRow(Detail):
    """One optimizer step of two runs' loss curves, side by side."""

    step: int
    first: str
    second: str
    same: bool


class DeterminismDetails(Detail):
    """`ran` once two runs were compared; a check cut short (no budget for the rerun, a rerun
    that hung) holds only the runs it compared, and the stage's `stopped` says why."""

    ran: bool
    compared: list[str]  # the labels of the runs compared with run 1
    returned_ignored: list[str] | None = None  # returned keys left out as timings
    curves: list[CurveRow] | None = None
    labels: list[str] | None = None  # the two runs the curves show
    verdict: str | None = None
    kind: str | None = None  # where a divergence comes from: hash-order, unseeded-random, ...
    # Never set: a check cut short renders an empty note, as the template reads `note` off
    # every check that did not run.
    note: str | None = None


class ConcurrencyChecks(Detail):
    gradscaler: ProtocolDetails | CheckNote
    dataloader: LoaderDetails | CheckNote
    nonblocking: NonBlockingDetails | CheckNote
    streams: CheckNote
    determinism: DeterminismDetails | CheckNote


class ConcurrencyDetails(SessionDetails[ConcurrencyRun, ConcurrencyChecks]):
    """The concurrency stage's details: the session's envelope over its runs and checks."""
