"""Payloads of the performance stage's instruments.

Both are written by `stages/performance/probe/instrument.py`: `light` (`LightProbe`, the timing
runs) hands back the step clock only; `full` (`FullProbe`, the one instrumented run) adds the
storage tracker's memory series and leak checks, the sync counter, the autocast counts, the
sampler and the instrumented window. The parent side reads them in stages/performance/stage.py
and the analyses it calls (memory.py, sync.py, timing.py, amp.py).

Sites travel as JSON lists `[path relative to the target root, line, function]`; step
intervals as dict keys are the interval's index as a string (`{"3": 2}`), as JSON needs.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, StringConstraints, model_validator

from ...contract.payloads.base import Payload, Site

# The stage's instruments: `module:factory` specs the entrypoint harness resolves in the target's process.
# This package under the name it runs as (the gate's own, or a run's copy: docs/edited-tests.md).
_PROBES = __name__.rpartition(".")[0]
PERFORMANCE_FULL = f"{_PROBES}.instrument:full"
PERFORMANCE_LIGHT = f"{_PROBES}.instrument:light"

# A code location as `FrameIndex.site` makes it: (path, line, function); a list in JSON. The
# compact key of the hot paths' records; where a record carries the source line it is a `Site`.
SiteKey = tuple[str, int, str]
# A step interval's index as a dict key (`str(step)`): the analyses turn it back with int().
StepKey = Annotated[str, StringConstraints(pattern=r"^[0-9]+$")]


# -- the step clock (probe/clock.py: StepClock.collect) ------------------------------------
class PhaseTimes(Payload):
    """Seconds per step, in total (`step`, instrument time left out) and per phase: one entry
    per completed step in every list."""

    step: list[float]
    data: list[float]
    forward: list[float]
    backward: list[float]
    optimizer: list[float]
    rest: list[float]

    @model_validator(mode="after")
    def _one_entry_per_step(self) -> PhaseTimes:
        lengths = {len(self.step), len(self.data), len(self.forward), len(self.backward), len(self.optimizer), len(self.rest)}
        if len(lengths) != 1:
            raise ValueError(f"the phase lists differ in length: {sorted(lengths)}")
        return self


class LoaderSettings(Payload):
    """The DataLoader's settings, each read with `getattr(loader, name, None)`."""

    batch_size: int | None
    num_workers: int | None
    pin_memory: bool | None
    prefetch_factor: int | None
    persistent_workers: bool | None


class LoaderRecord(Payload):
    """A DataLoader the target made, and how long the steps waited on it; timing.py picks the
    one that fed most steps for `input-stall`."""

    site: SiteKey | None  # where it was made; None when no target frame was on the stack
    settings: LoaderSettings
    dataset: str  # the dataset's module-qualified class name
    getitem: SiteKey | None  # the dataset's `__getitem__` when it is the target's code
    wait_s: float
    batches: int
    fed_steps: int  # steps whose last batch came from this loader
    step_waits: dict[StepKey, float]  # seconds waited, per step interval with a wait


class StepClockRecord(Payload):
    """Step boundaries, per-phase times and losses of the main thread (`StepClock.collect`)."""

    steps: int
    backward_calls: int
    training_forwards: int
    training_device: str  # the first optimizer's parameters' device: "cpu", "cuda:0"
    host: PhaseTimes
    device: PhaseTimes | None  # CUDA event times; None off CUDA or when an event is missing
    losses: list[float | None]  # one per step; None where no finite scalar loss was seen
    loaders: list[LoaderRecord]
    forward_sites: list[tuple[SiteKey, int]]  # the outermost forward calls' sites and counts, top 5
    peak_memory_bytes: int | None  # torch.cuda.max_memory_allocated; None off CUDA
    truncated: bool  # the clock stopped at its step cap

    @model_validator(mode="after")
    def _one_entry_per_step(self) -> StepClockRecord:
        for name, count in (("host", len(self.host.step)), ("device", len(self.device.step) if self.device else self.steps), ("losses", len(self.losses))):
            if count != self.steps:
                raise ValueError(f"{name} has {count} entries for {self.steps} steps")
        return self


# -- memory held between steps (FullProbe, probe/holders.py, probe/tracker.py) -------------
class RetainedSite(Payload):
    """Storages made at one site after warm-up that are still alive, and over how many steps."""

    site: Site | None  # None: made where no target frame was on the stack
    storages: int
    bytes: int
    steps: int


class HolderRecord(Payload):
    """The named thing that holds retained tensors (`Holder.record`)."""

    kind: Literal["local", "global", "attribute"]
    name: str
    owner: str  # the function, module or class the name belongs to
    path: str
    line: int
    held_type: str
    chain: list[str]  # container types between the name and the tensor, innermost first
    graph: bool  # the held tensors carry their autograd graphs
    description: str  # memory.py matches growth lines and graph series on it
    reference: str
    steps: int | None = None  # a held graph: the distinct steps its nodes come from (None: not numbered)
    reach: int | None = None  # tensors reachable from it through its containers (a holder found by the search)


class CheckHolder(HolderRecord):
    """What held the retained tensors at a check, and where they were made."""

    created_at: Site | None
    # Autograd nodes the holder's innermost container keeps; only when the held tensors
    # carry their graphs through a container.
    nodes: int | None = None


class GraphHolder(HolderRecord):
    """A named tensor whose autograd graph spans several steps, with its size at the check."""

    created_at: Site | None
    nodes: int


class LeakCheck(Payload):
    """One check at a step boundary: the sites with storages surviving most earlier steps,
    what holds them, and the named graphs spanning several steps."""

    step: int
    span: int  # steps from warm-up to the step before last
    sites: list[RetainedSite]
    holder: CheckHolder | None
    graphs: list[GraphHolder]
    others: list[HolderRecord] = []  # other names holding the same tensors, reaching fewer


class GrowthLine(Payload):
    """A line after which a holder's container grew while one step was traced."""

    holder: str  # the holder's description
    container: str  # the container's type
    depth: int  # its place in the holder's chain, innermost first
    site: Site


class MemoryRecord(Payload):
    """The memory series and the leak attribution; memory.py reads it."""

    source: Literal["torch.cuda.memory_allocated", "live tensor storages (dispatch-mode registry)"]
    held_bytes: list[int]  # at each step boundary of the instrumented window
    host_source: str | None = None  # probe/host_memory.py: which host measure; None: none here
    host_bytes: list[int] = []  # the process's host memory at the same boundaries
    peak_tracked_bytes: int
    storages_registered: int
    checks: list[LeakCheck]
    step_graph_nodes: int  # one step's autograd graph, counted up to the walk cap
    growth_lines: list[GrowthLine]
    retained_at_end: list[RetainedSite]
    graph_steps: list[GraphSteps] = []  # named graphs followed at every step boundary


class GraphSteps(Payload):
    """A named tensor whose autograd graph held several steps at a step boundary, followed at
    every boundary since: [step, steps its graph held] (0 once the name holds no graph)."""

    holder: HolderRecord
    points: list[list[int]]


# -- host-device syncs (probe/syncs.py: SyncCounter.collect) -------------------------------
class SyncSiteRecord(Payload):
    """Syncs of one kind from one call site, per step interval; sync.py groups them by site."""

    kind: str
    explicit: bool  # an explicit synchronize() call
    site: SiteKey | None
    direct: bool  # the target's own line made it (else a library it called, named in `via`)
    via: str
    per_step: dict[StepKey, int]
    before_training: int


class SyncDebugRecord(Payload):
    """CUDA's sync debug mode's warnings at one target line, per step interval."""

    site: SiteKey | None
    per_step: dict[StepKey, int]


class SyncRecords(Payload):
    records: list[SyncSiteRecord]
    in_data_loading: int  # syncs made while a batch was produced: left out
    steps_counted: int | None  # set when counting stopped with the window of a heavy loop
    sync_debug_mode: list[SyncDebugRecord] | None  # None off CUDA


# -- mixed precision (probe/tracker.py: Tracker.amp_record) --------------------------------
class AutocastRecord(Payload):
    """One autocast context (by site, device, dtype, enabled) and the matmuls run inside it."""

    site: SiteKey | None
    device: str
    dtype: str
    enabled: bool
    entries: int
    matmuls: dict[str, int]  # by input dtype


class AmpCounts(Payload):
    """Matrix products by input dtype; amp.py decides from them whether AMP computed anything
    in reduced precision."""

    matmul_dtypes_in_steps: dict[str, int]
    matmul_dtypes_outside_steps: dict[str, int]
    reduced_in_steps: int  # float16 and bfloat16 ones inside the steps
    autocast: list[AutocastRecord]


# -- the main-thread sampler (probe/sampler.py: Sampler.collect) ---------------------------
class SampledSite(Payload):
    phase: Literal["data", "rest"]  # the sampler skips the forward, backward and optimizer phases
    site: SiteKey | None
    count: int


class SamplerRecord(Payload):
    """Samples outside the four phases (and in the data wait); timing.py reads the top lines."""

    interval_s: float
    samples: list[SampledSite]


# -- the instrumented window (FullProbe.collect) -------------------------------------------
class InstrumentationWindow(Payload):
    """How many steps the per-operator instruments saw, and why; stage.py reports it."""

    ops_per_step: int | None  # operators of the last warm-up step; None before it ended
    heavy_ops_per_step: int
    window_end: int | None  # None: the loop was not heavy, every step was instrumented
    window_planned: int | None
    ended_steady: bool
    instrumented_steps: int
    graph_walk_capped: bool
    graph_walk_cap: int


# -- the two payloads ----------------------------------------------------------------------
class ProcessRecord(Payload):
    """The timing run's own process: its CPU time per step (what load on other cores moves
    least) and the torch build and device it ran on (what a stored timing is compared by)."""

    cpu_step: list[float]  # process CPU seconds (all its threads) per completed step
    cpu_s: float  # the process's CPU seconds since it started, its reaped children's included
    torch: str  # torch.__version__, with torch.version.cuda where built for CUDA
    device_name: str | None  # torch.cuda.get_device_name of the training device; None off CUDA


class LightPayload(Payload):
    """`PERFORMANCE_LIGHT` (`LightProbe.collect`): the timing runs' step clock, read by
    stage.py and timing.py / amp.py."""

    clock: StepClockRecord
    process: ProcessRecord | None = None


class FullPayload(Payload):
    """`PERFORMANCE_FULL` (`FullProbe.collect`): the instrumented run, read by stage.py's
    `analyse` and the analyses it calls."""

    clock: StepClockRecord
    memory: MemoryRecord
    syncs: SyncRecords
    amp: AmpCounts
    sampler: SamplerRecord
    instrument_s: float  # seconds the instruments spent at step boundaries
    instrumentation: InstrumentationWindow


MODELS: dict[str, type[BaseModel]] = {
    PERFORMANCE_FULL: FullPayload,
    PERFORMANCE_LIGHT: LightPayload,
}
