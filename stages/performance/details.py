"""The performance stage's `details`: what its report (`report.md.j2` beside this module) shows.

The stage and its analyses build them (`traingate.stages.performance`) and hand them back as
`model_dump(mode="json", exclude_unset=True)` inside the StageOutcome, so report.json keeps
plain JSON; the renderer validates them again and the template reads the models. the payload records they carry as the probe wrote them (a held tensor's holder,
the autocast counts) are the instruments' own models (the stage's `probe/payloads.py`).

Dumped with `exclude_unset`: a key the stage leaves out (the sign test of a stall that had no
loader, a regression row's step count where a median was compared) stays out of report.json,
and a probe record keeps only the keys the probe wrote. So every model is built with each of
its fields given, None included, unless leaving it out is what it records.
Every top-level part is optional: a skipped or failed stage hands back no details.
"""

from __future__ import annotations

from typing import Any, Literal

from traingate.pipeline.model.details import Detail
from traingate.pipeline.model.schema import Location
from traingate.stages.contract.payloads.base import Site
from traingate.stages.performance.probe.payloads import (
    AmpCounts,
    CheckHolder,
    GraphHolder,
    GrowthLine,
    InstrumentationWindow,
    LoaderSettings,
    RetainedSite,
    SiteKey,
    SyncDebugRecord,
)

# The step's phases (stages/performance/timing.py), in the breakdown's order.
Phase = Literal["data", "forward", "backward", "optimizer", "rest"]
# The kind of device the loop trained on: what the thresholds and the baseline compare by.
DeviceKind = Literal["cpu", "cuda"]


class Measured(Detail):
    """A part of the details, or a record an analysis also copies into a finding's evidence."""

    def data(self) -> dict[str, Any]:
        """As report.json (and a finding's evidence) holds it: the keys the stage set."""
        return self.model_dump(mode="json", exclude_unset=True)


# -- shared statistics ---------------------------------------------------------------------


class SignTestRecord(Measured):
    """A one-sided sign test over per-step observations (stages/performance/sign_test.py)."""

    test: str  # always "one-sided sign test"
    above: int
    steps: int
    p_value: float
    p_below: float
    alpha: float
    statement: str


class SpreadRecord(Measured):
    """A ratio with its 95 % interval (stages/performance/spread.py)."""

    ratio: float
    low: float
    high: float
    within_noise: bool
    method: str


class StepRecord(Measured):
    """A timing run's step time after warm-up, in ms."""

    steps: int
    median_ms: float
    iqr_ms: float
    mad_ms: float
    clock: str  # "cuda events" or "host"


# -- the runs ------------------------------------------------------------------------------


class LoadRecord(Measured):
    """What other processes did while a timing run ran (stages/performance/load.py)."""

    wall_s: float
    other_cpu_share: float | None  # their CPU time / (cores x wall time); None: /proc/stat unreadable
    own_cpu_s: float | None  # the run's own process CPU time, as its probe read it
    loadavg: float | None  # the 1-minute load average at the run's end
    quiet: bool  # other_cpu_share at most load.QUIET_SHARE


class MachineRecord(Measured):
    """The machine a timing ran on: a stored timing is compared only on the same one."""

    cpu_model: str | None
    cpus: int  # the cores the stage's process may run on
    device: str  # "cpu" or "cuda"
    device_name: str | None  # the CUDA device's name; None on CPU
    torch: str | None  # the torch build of the timing runs
    omp_wait_policy: str | None = None  # OMP_WAIT_POLICY of the timing runs; None: unset (an older gate)


class RunRecord(Measured):
    label: str
    amp: bool | None  # None: the target's own setting (no AMP flag)
    steps: int
    duration_s: float
    load: LoadRecord | None = None  # timing runs only


class StepCounts(Measured):
    observed: int
    warmup: int
    profiled: int
    truncated: bool  # the step clock stopped at its cap
    instrumented: int  # steps the storage tracker and sync counter saw


# -- memory held between steps (stages/performance/memory.py, leak.py) ---------------------


class LeakRecord(Measured):
    """The trend test over one memory series (`LeakVerdict.record`): floats to 4 digits."""

    leak: bool
    reason: str
    steps: int
    slope_bytes_per_step: float  # Theil-Sen
    ls_slope_bytes_per_step: float
    r2: float
    increasing_fraction: float
    mann_kendall_z: float
    total_growth_bytes: float
    start_bytes: float
    noise_bytes: float
    segments: list[tuple[float, float]]  # (10th, 90th percentile) of each segment


class NodeGrowth(Measured):
    """Autograd nodes held between steps: the fastest-growing holder, if any."""

    leak: bool
    per_step: float | None  # None: fewer than two counts, or counts stopped at the walk cap
    held_by: str | None
    points: list[list[int]]  # [step, nodes]
    steps_held: list[list[int | None]]  # [step, steps the graph's nodes come from]


class MemoryVerdict(LeakRecord):
    """One verdict over tensor bytes, held graphs and host memory; the bytes' statistics stay
    under their own names (LeakRecord's), `leak` and `reason` are the combined ones."""

    bytes_leak: bool
    bytes_reason: str
    nodes: NodeGrowth
    host: LeakRecord | None  # None: no host measure on this system


class HostMemory(Measured):
    source: str | None  # the host measure (probe/host_memory.py); None: none here
    verdict: LeakRecord | None


class Chart(Measured):
    """At most 60 evenly spaced points of the held-memory series."""

    steps: list[int]
    kib: list[float]
    warmup: int


class TableRow(Measured):
    step: int
    bytes: int
    delta: int  # against the row before
    warmup: bool


class StoredAt(Measured):
    """The line that stores into a leak's holder, and how it was found."""

    path: str
    line: int
    function: str
    code: str
    how: str


class Attribution(Measured):
    """Where retained tensors were created, what holds them, and where it is stored into."""

    sites: list[RetainedSite]
    holder: CheckHolder | None
    growth: GrowthLine | None  # the line seen growing the holder while one step was traced
    checked_at_step: int | None
    stores: list[Site]  # the lines the source stores into the holder with (ast)
    stored_at: StoredAt | None


class HeldGraphRecord(Measured):
    """One named tensor's autograd graph over the leak checks."""

    description: str
    holder: GraphHolder  # as seen at the last check
    points: list[list[int]]  # [step, nodes]
    steps_held: list[list[int | None]]  # [step, steps its nodes come from]
    step_nodes: int  # one step's graph, counted up to the walk cap
    growing: bool


class KeptPoint(Measured):
    step: int
    description: str
    storages: int
    steps: int
    span: int
    nodes: int | None


class KeptGraphs(Measured):
    """A container that keeps one tensor per step with its autograd graph (`losses.append(loss)`)."""

    description: str
    points: list[KeptPoint]


class MemoryDetails(Measured):
    source: str  # what the held bytes are measured as
    verdict: MemoryVerdict
    host: HostMemory
    chart: Chart
    table: list[TableRow]
    peak_tracked_bytes: int
    attribution: Attribution
    graphs: list[HeldGraphRecord]
    kept_graphs: KeptGraphs | None


# -- host-device syncs (stages/performance/sync.py) ----------------------------------------


class SyncRow(Measured):
    """The syncs of one call site."""

    path: str
    line: int
    function: str
    code: str
    kinds: list[str]
    explicit: bool
    in_steps: int
    per_step: float  # over the whole steps between two boundaries
    steps_with_sync: int
    outside_steps: int
    made_by: Literal["target", "library"]
    finding: bool


class SyncSummary(Measured):
    rows: list[SyncRow]
    target_per_step: float
    library_per_step: float
    in_data_loading: int  # syncs while a batch was produced: not counted
    cuda_sync_debug: list[SyncDebugRecord] | None  # None off CUDA
    counted_as: str


# -- step time, its breakdown, input stall (stages/performance/timing.py) -------------------


class SampledLine(Measured):
    """A target line the main-thread sampler hit in one phase."""

    site: SiteKey
    samples: int
    approx_ms: float


class PhaseShare(Measured):
    phase: Phase
    mean_ms: float
    share: float


class Breakdown(Measured):
    """Mean time per step in each phase of the primary timing run."""

    steps: int
    clock: str
    phases: list[PhaseShare]
    run: str  # the timing run's label
    rest_sites: list[SampledLine]  # the heaviest lines in "rest", from the instrumented run


class LoaderSummary(Measured):
    """The DataLoader that fed the training steps, as its payload record has it, without the
    per-step waits."""

    site: SiteKey | None
    settings: LoaderSettings
    dataset: str
    getitem: SiteKey | None
    wait_s: float
    batches: int
    fed_steps: int


class StallDetails(Measured):
    steps: int  # profiled steps with a wait share
    median_share: float | None
    loader: LoaderSummary | None
    min_steps: int
    sign_test: SignTestRecord | None = None  # left out when no step was measured
    decided: bool


# -- mixed precision (stages/performance/amp.py) -------------------------------------------


class AmpSide(Measured):
    """One timing run of the AMP comparison."""

    steps: int
    step: StepRecord | None  # None: fewer steps than performance.min_steps
    peak_memory_bytes: int | None  # None off CUDA
    final_loss: float | None  # the mean of the last few steps' losses
    final_loss_steps: int
    losses: list[float | None]


class AmpSides(Measured):
    fp32: AmpSide
    amp: AmpSide


class AmpComparison(Measured):
    """AMP on against off (`amp.compare`): ratios are None where not measured, or where AMP
    was not active (`active` False: both runs computed in fp32)."""

    device: str
    sides: AmpSides
    active: bool | None  # None: no matrix product was counted
    speedup: float | None
    speedup_spread: SpreadRecord | None
    memory_reduction: float | None
    loss_drift: float | None
    loss_drift_interval: tuple[float, float] | None = None  # two standard errors of the paired final steps
    reduced_dtype: str | None = None  # the AMP run's reduced matmul dtype
    drift_explained: float | None = None  # that dtype's unit roundoff: what its rounding alone explains


class AmpDetails(AmpComparison):
    counts: AmpCounts  # the instrumented AMP run's matrix products by dtype
    location: Location | None  # where AMP is entered (or the loop's model call)


# -- the baseline (stages/performance/regression.py) ---------------------------------------


class RegressionRow(Measured):
    """One metric against the baseline's; a step time with too few steps for a median is
    compared step by step (`steps`, `sign_test` set only then)."""

    metric: str
    metric_id: str
    unit: str
    baseline: int | float
    current: int | float
    ratio: float
    allowed: float  # the relative worsening measurement noise allows
    regressed: bool
    spread: SpreadRecord | None  # a step time's ratio interval from both runs' IQRs
    steps: int | None = None
    sign_test: SignTestRecord | None = None


class NotComparable(Measured):
    """A stored step time of the baseline report this run's could not be compared with."""

    metric: str
    metric_id: str
    reason: str


class PairRatio(Measured):
    """Two adjacent timing runs, one of each version: this version's step time over the baseline's."""

    runs: list[str]  # the two runs' labels, in the order they ran
    spread: SpreadRecord  # the ratio of their medians, with its bootstrap interval


class SideMeasure(Measured):
    """One measure of the side-by-side timing over every adjacent pair of runs."""

    measure: str  # "wall clock", "cuda events" or "process CPU time"
    pairs: list[PairRatio]
    verdict: Literal["slower", "not slower", "not measured"]
    reason: str


class SideBySide(Measured):
    """The baseline's code timed beside this version's, interleaved (stages/performance/side_by_side.py)."""

    commit: str
    label: str  # the timing setting compared ("amp", "default")
    order: list[str]  # the runs in the order they ran
    threshold: float  # the relative slowdown that counts as a regression
    measures: list[SideMeasure]
    verdict: Literal["slower", "not slower", "not measured"]
    reason: str
    baseline_step_ms: float | None  # the median of the version's runs' lower quartiles
    current_step_ms: float | None


class RegressionDetails(Measured):
    compared: list[RegressionRow]
    note: str | None  # why nothing was compared
    side_by_side: SideBySide | None = None
    not_comparable: list[NotComparable] = []
    side_by_side_note: str | None = None  # why the baseline's code was not timed beside this version's


# -- the stage -----------------------------------------------------------------------------


class PerformanceDetails(Measured):
    device: str | None = None  # the training device, as torch names it ("cpu", "cuda:0")
    device_kind: DeviceKind | None = None
    steps: StepCounts | None = None
    instrumentation: InstrumentationWindow | None = None
    runs: list[RunRecord] = []
    memory: MemoryDetails | None = None
    syncs: SyncSummary | None = None
    amp: AmpDetails | None = None  # None: no AMP flag, or a timing run missing
    amp_flag: str | None = None
    timing: dict[str, StepRecord] = {}  # by timing run label, the runs with enough steps
    breakdown: Breakdown | None = None
    stall: StallDetails | None = None
    regression: RegressionDetails | None = None
    not_measured: list[str] = []
    instrument_s: float | None = None
    machine: MachineRecord | None = None  # where the timing runs ran
    timing_notice: str | None = None  # timings that could not be compared or measured: the page says so first
