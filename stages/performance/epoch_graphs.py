"""`memory-leak` for an autograd graph that grows through every epoch and is released at its
end (`total += loss * n`, reset when the next epoch starts).

Checks a fixed number of steps apart can alias with the epoch (eight steps apart on an
eight-step epoch see the same phase every time, and read "flat"), so the probe follows every
named graph that held TRACK_STEPS steps at every step boundary (`graph_steps`). A series that
rises by one step per step and drops back at least once is such a leak: bounded by the epoch
in this run, it scales with the epoch's length. Its size per step is the host memory's growth
over the steps the graph grew (the graph's nodes are not tensor bytes); it is projected to the
epoch length the run saw (the steps between releases) and to a ten times longer one.

High, as a per-step leak: the tiny configuration's epochs release it after a few steps, but it
grows by one step's graph a step for as long as an epoch lasts, and a real epoch is as long
as its data (the projection says how much a ten times longer one keeps).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from statistics import median

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Severity
from traingate.stages.base import StageContext, location_of
from traingate.stages.performance.probe.payloads import GraphSteps, MemoryRecord
from traingate.stages.performance.stores import storing_lines
from traingate.stages.performance.rules import MEMORY_LEAK

CATEGORY = MEMORY_LEAK
GRAPH_STEPS = 3  # steps held before a drop that counts as a release
RELEASED = 2  # at most this many steps held right after a release
RISING_SHARE = 0.75  # of the boundaries between releases, those where the graph held one more step
LONGER = 10


@dataclass(frozen=True)
class EpochGraph:
    series: GraphSteps
    releases: list[int]  # steps at which the graph was released
    epoch_steps: int  # steps between releases (the most held plus one with a single release)
    peak: int  # the most steps it held
    bytes_per_step: float | None  # host memory growth per step while it grew
    nodes_per_step: int

    @property
    def description(self) -> str:
        return self.series.holder.description

    def projected(self, steps: int) -> float | None:
        return None if self.bytes_per_step is None else self.bytes_per_step * steps


def epoch_graphs(memory: MemoryRecord) -> list[EpochGraph]:
    """The named graphs that grew by a step per step and were released at least once."""
    found = []
    for series in memory.graph_steps:
        points = series.points
        releases = [b[0] for a, b in pairwise(points) if a[1] >= GRAPH_STEPS and b[1] <= RELEASED and b[0] == a[0] + 1]
        if not releases:
            continue
        moves = [(a, b) for a, b in pairwise(points) if b[0] == a[0] + 1 and b[0] not in releases]
        rising = [b for a, b in moves if b[1] == a[1] + 1]
        if not moves or len(rising) < RISING_SHARE * len(moves):
            continue
        peak = max(p[1] for p in points)
        gaps = [b - a for a, b in pairwise(releases)]
        epoch = int(median(gaps)) if gaps else peak + 1
        found.append(EpochGraph(series, releases, epoch, peak, _host_growth(memory, [b[0] for b in rising]), memory.step_graph_nodes))
    return found


def _host_growth(memory: MemoryRecord, steps: list[int]) -> float | None:
    """Median host memory growth at the boundaries `steps` (1-based: the series starts at step 1)."""
    host = memory.host_bytes
    diffs = [host[s - 1] - host[s - 2] for s in steps if 2 <= s <= len(host)]
    return float(median(diffs)) if diffs and memory.host_source else None


def epoch_finding(ctx: StageContext, graph: EpochGraph, device: str) -> Finding:
    holder = graph.series.holder
    stores = storing_lines(ctx.root, holder)
    site = stores[0] if stores else None
    epoch, longer = graph.epoch_steps, graph.epoch_steps * LONGER
    at_epoch, at_longer = graph.projected(epoch), graph.projected(longer)
    per_step = f"{_bytes(graph.bytes_per_step)} of host memory" if graph.bytes_per_step is not None else "a size the host memory did not measure"
    projection = (
        f"At this run's epoch length ({epoch} steps) it holds about {_bytes(at_epoch)} by the epoch's end; at an epoch {LONGER} times longer ({longer} steps), about {_bytes(at_longer)}."
        if at_epoch is not None and at_longer is not None else
        f"At this run's epoch length ({epoch} steps) it holds {epoch} steps' graphs by the epoch's end; at an epoch {LONGER} times longer, {longer}."
    )
    where = f" at {site.path}:{site.line} (`{site.code}`)" if site else ""
    held = ", ".join(f"{n} at step {s}" for s, n in graph.series.points[:24])
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=f"An autograd graph held by {holder.description} grows through every epoch and is released at its end: a leak that scales with the epoch's length",
        location=location_of(site),
        problem=(
            f"The tensor stored{where} keeps every step's autograd graph until the epoch ends: followed at every step boundary, the steps its graph held "
            f"were {held}. It grew by one step's graph a step and was released at step(s) {', '.join(map(str, graph.releases[:8]))}, every {epoch} steps: "
            f"the epoch's length in this run. Each step adds {per_step} (one step's graph has {graph.nodes_per_step:,} nodes) on {device}. {projection} "
            "Checks a fixed number of steps apart would see it at one phase of the epoch only and read it as flat."
        ),
        fix=f"Accumulate a number, not the tensor: add `loss.item()` (or `loss.detach()`) into {holder.name}, so that no step's graph outlives the step.",
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"{holder.description}: graph of up to {graph.peak} steps, released every {epoch} steps; {per_step} a step",
            data={
                "held_by": holder.model_dump(mode="json", exclude_unset=True), "steps_held_at_step": graph.series.points, "released_at_steps": graph.releases,
                "epoch_steps": epoch, "peak_steps_held": graph.peak, "host_bytes_per_step": graph.bytes_per_step, "one_step_graph_nodes": graph.nodes_per_step,
                "projected_bytes_at_epoch": at_epoch, "projected_bytes_at_longer_epoch": at_longer, "longer_epoch_steps": longer,
                "stored_at": site.model_dump(mode="json") if site else None, "device": device,
            },
        ),
        key=f"epoch-graph\x1f{holder.kind}:{holder.owner}:{holder.name}",
    )


def _bytes(n: float | None) -> str:
    if n is None:
        return "an unmeasured size"
    if abs(n) >= 2**20:
        return f"{n / 2**20:.2f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n:.0f} bytes"
