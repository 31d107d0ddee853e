"""`memory-leak`: memory held between training steps grows with the number of steps.

The verdict is statistical (leak.py) over the memory held at each step
boundary of the instrumented run. A leak is then attributed with what the run observed:
the creation sites of storages that survive from most earlier steps, the named container
holding them (a local list, `self.history`, a module global), and the line after which that
container grew while one step was traced. The finding points at that line (the append that
keeps every step), else at where the retained tensors were created.

A container that keeps one tensor per step with its autograd graph (`losses.append(loss)`),
seen growing from one check to the next, is a leak even when those tensors' bytes stay under
the floor: each keeps its step's graph nodes, which no byte count shows.
A tensor bound to a name whose autograd graph keeps growing between checks (a running
`total = total + loss`) is a leak too, though backward has freed its saved tensors: the
graph's nodes stay. It is found at a few step boundaries by the number of steps whose nodes
the graph holds (a descent to its oldest nodes, probe/graph_span.py), which does not depend
on the graph's size, and by its node count up to the walk cap (10,000 nodes).

The third measure is the process's host memory at each step boundary (probe/host_memory.py),
with the same trend test and its own floor (HOST_MIN_SLOPE_BYTES). It sees what the tensor
bytes cannot: graph nodes, objects outside torch. When a growing held graph explains it,
it is part of that graph's finding; when nothing does, it is a finding of its own, at the
training loop's model call.

A named graph released at every epoch's end (followed at every step boundary, so that the
checks cannot alias with the epoch) is its own finding (epoch_graphs.py), in place of the
growing-graph one.

One verdict covers the three measures: a leak found from any of them is the verdict's, the
metric's and the report's, whatever the others say; all are shown.

Severity: high when the growth is steady (r^2 >= 0.9, or a significant Mann-Kendall trend
with r^2 >= 0.5) and large (at least a quarter of what
was held when profiling began, or 1 MiB per step) or when the retained tensors keep their
autograd graphs (each step then also keeps graph nodes, which no byte count shows);
medium otherwise.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

from pydantic import BaseModel

from traingate.stages.performance.details import (
    Attribution as AttributionRecord,
    Chart,
    HeldGraphRecord,
    HostMemory,
    KeptGraphs,
    KeptPoint,
    MemoryDetails,
    MemoryVerdict,
    NodeGrowth,
    StoredAt,
    TableRow,
)
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, location_of
from traingate.stages.contract.payloads.base import Site
from traingate.stages.performance.probe.payloads import CheckHolder, GraphHolder, GrowthLine, HolderRecord, LeakCheck, MemoryRecord, RetainedSite
from traingate.stages.performance.leak import HOST_MIN_SLOPE_BYTES, MIN_SLOPE_BYTES, LeakVerdict, decide
from traingate.stages.performance.stores import foreign, storing_lines
from traingate.stages.performance.epoch_graphs import epoch_finding, epoch_graphs
from traingate.stages.performance.rules import MEMORY_LEAK

CATEGORY = MEMORY_LEAK
STEADY_R2 = 0.9
MIN_R2 = 0.5
STEADY_Z = 3.0  # Mann-Kendall: a rising trend at p < 0.003
LARGE_FRACTION = 0.25
LARGE_SLOPE_BYTES = 1 << 20
CHART_POINTS = 60
GRAPH_STEPS = 3
TABLE_ROWS = 12


def analyse(ctx: StageContext, memory: MemoryRecord, warmup: int, min_steps: int, device: str, loop_site: Location | None = None) -> tuple[MemoryDetails, list[Finding]]:
    """Details and findings from the tensor bytes, the host memory and the autograd graphs
    held between steps; `loop_site` (the training loop's model call) locates a host-memory
    leak nothing else located."""
    held = list(memory.held_bytes)
    series = held[warmup:]
    verdict = decide([float(v) for v in series], min_steps)
    host = host_verdict(memory, warmup, min_steps)
    attribution = attribute(memory)
    attribution.stores = storing_lines(ctx.root, attribution.holder) if attribution.holder else []
    attribution.foreign = attribution.holder is not None and foreign(ctx.root, attribution.holder)
    attribution.stored_at = stored_at(attribution)
    graphs = growing_graphs(memory)
    host_leak = host if host is not None and host.leak else None
    # A graph seen released at an epoch's end is that leak, not one that grows for ever.
    epochs = epoch_graphs(memory)
    released = {e.description for e in epochs}
    kept = kept_graphs(memory)
    # A container of step graphs (`losses`) that the bytes' verdict names as the holder is that
    # leak, one verdict with both measures, not a second finding.
    bytes_holder = attribution.holder.description if attribution.holder is not None and (verdict.leak or (kept is not None and verdict.steps >= min_steps)) else None
    findings = [_graph_finding(ctx, g, memory, device, host_leak) for g in graphs if g.growing and g.holder.description not in released and g.holder.description != bytes_holder]
    findings += [epoch_finding(ctx, e, device) for e in epochs]
    nodes = node_growth(graphs, kept if verdict.steps >= min_steps else None)
    if verdict.leak:
        findings.insert(0, _finding(ctx, verdict, attribution, memory, device, nodes=nodes))
    elif kept is not None and verdict.steps >= min_steps:
        findings.insert(0, _finding(ctx, verdict, attribution, memory, device, kept, nodes=nodes))
    elif host_leak is not None and not findings:
        findings.append(host_finding(ctx, host_leak, verdict, memory, device, loop_site))
    details = MemoryDetails(
        source=memory.source,
        verdict=combined_verdict(verdict, nodes, leak=bool(findings), host=host),
        host=HostMemory(source=memory.host_source, verdict=host.record() if host else None),
        chart=chart(held, warmup),
        table=table(held, warmup),
        peak_tracked_bytes=memory.peak_tracked_bytes,
        attribution=attribution.record(),
        graphs=[g.record() for g in graphs],
        kept_graphs=kept,
    )
    return details, findings


def host_verdict(memory: MemoryRecord, warmup: int, min_steps: int) -> LeakVerdict | None:
    """The same trend test over the process's host memory, with the host floor; None when
    the probe had no host measure."""
    host = [float(v) for v in memory.host_bytes]
    if not memory.host_source or len(host) <= warmup:
        return None
    return decide(host[warmup:], min_steps, floor=HOST_MIN_SLOPE_BYTES)


def node_growth(graphs: list[HeldGraph], kept: KeptGraphs | None) -> NodeGrowth:
    """The second measure: autograd nodes held between steps, per step, from the checks.
    The fastest-growing holder: a named tensor whose graph keeps growing, or a container
    that keeps each step's tensors with their graphs. `leak` when one of them is a leak.
    Node counts that stopped at the walk cap give no rate (None); the steps held are kept."""
    series: list[tuple[str, list[list[int]], list[list[int | None]]]] = [(g.holder.description, g.points, g.steps_held) for g in graphs if g.growing]
    if kept is not None:
        series.append((kept.description, [[p.step, p.nodes] for p in kept.points if p.nodes is not None], []))
    measured = []
    for description, points, steps_held in series:
        per_step = None
        if len(points) >= 2:
            (first_step, first), (last_step, last) = points[0], points[-1]
            per_step = (last - first) / max(1, last_step - first_step)
        measured.append(NodeGrowth(leak=True, per_step=per_step if per_step else None, held_by=description, points=points, steps_held=steps_held))
    if not measured:
        return NodeGrowth(leak=False, per_step=None, held_by=None, points=[], steps_held=[])
    return max(measured, key=lambda m: m.per_step if m.per_step is not None else -1.0)


def combined_verdict(bytes_verdict: LeakVerdict, nodes: NodeGrowth, leak: bool, host: LeakVerdict | None = None) -> MemoryVerdict:
    """One verdict over the three measures: a leak when the tensor bytes held grow, an
    autograd graph held between steps grows, or the host memory grows. The bytes verdict's
    statistics stay, under their own names; the host's are under `host`."""
    record = bytes_verdict.record()
    host_note = f"; host memory: {host.reason}" if host is not None else ""
    if bytes_verdict.leak:
        reason = bytes_verdict.reason
    elif leak and nodes.held_by:
        per_step = f"{nodes.per_step:,.0f} autograd nodes per step" if nodes.per_step else "every step's autograd nodes"
        reason = f"{nodes.held_by} keeps {per_step} (tensor bytes: {bytes_verdict.reason}{host_note})"
    elif leak and host is not None and host.leak:
        reason = f"host memory {host.reason}, while the tensor bytes do not ({bytes_verdict.reason})"
    elif leak:
        reason = f"autograd graphs held between steps grow (tensor bytes: {bytes_verdict.reason}{host_note})"
    else:
        reason = bytes_verdict.reason + host_note
    return MemoryVerdict(
        **record.model_dump(exclude={"leak", "reason"}), leak=leak, reason=reason, bytes_leak=bytes_verdict.leak, bytes_reason=bytes_verdict.reason,
        nodes=nodes, host=host.record() if host is not None else None,
    )


def kept_graphs(memory: MemoryRecord) -> KeptGraphs | None:
    """A container that keeps one tensor per step together with its autograd graph, seen
    growing at two checks at least: `losses.append(loss)`. Its tensor bytes may be under
    the floor (a scalar loss), but each kept tensor keeps its step's graph nodes too."""
    points: list[KeptPoint] = []
    for check in memory.checks:
        holder = check.holder
        if holder and holder.graph and holder.chain and check.sites:
            top = check.sites[0]
            points.append(KeptPoint(step=check.step, description=holder.description, storages=top.storages, steps=top.steps, span=check.span, nodes=holder.nodes))
    if len(points) < 2 or len({p.description for p in points[-2:]}) != 1:
        return None
    a, b = points[-2], points[-1]
    if b.storages <= a.storages or b.steps <= a.steps:
        return None
    return KeptGraphs(description=b.description, points=points)


@dataclass
class HeldGraph:
    """One named tensor's autograd graph over the checks: its size (`points`, [step, nodes])
    and the steps its nodes come from (`steps_held`, [step, steps or None]) at each."""

    holder: GraphHolder  # as seen at the last check
    points: list[list[int]]
    steps_held: list[list[int | None]]
    step_nodes: int
    growing: bool

    def record(self) -> HeldGraphRecord:
        return HeldGraphRecord(description=self.holder.description, holder=self.holder, points=self.points, steps_held=self.steps_held, step_nodes=self.step_nodes, growing=self.growing)


def growing_graphs(memory: MemoryRecord) -> list[HeldGraph]:
    """Autograd graphs held by one named tensor, by name, with their size and the steps they
    hold at each check. Growing: seen at two checks at least, and either holding nodes from
    more steps at each (and at least GRAPH_STEPS at the last: probe/graph_span.py, which does
    not depend on the graph's size), or larger at each and at the last at least GRAPH_STEPS
    steps' worth of nodes (where the nodes carry no creation numbers)."""
    step_nodes = memory.step_graph_nodes
    series: dict[str, HeldGraph] = {}
    for check in memory.checks:
        for g in check.graphs:
            item = series.setdefault(g.description, HeldGraph(g, [], [], step_nodes, False))
            item.points.append([check.step, g.nodes])
            item.steps_held.append([check.step, g.steps])
            item.holder = g
    for item in series.values():
        nodes = [n for _, n in item.points]
        spans = [n for _, n in item.steps_held]
        by_steps = len(spans) >= 2 and None not in spans and all(b > a for a, b in pairwise(_known(spans))) and _known(spans)[-1] >= GRAPH_STEPS
        by_nodes = step_nodes > 0 and len(nodes) >= 2 and all(b > a for a, b in pairwise(nodes)) and nodes[-1] >= GRAPH_STEPS * step_nodes
        item.growing = by_steps or by_nodes
    return list(series.values())


def _known(values: list[int | None]) -> list[int]:
    return [v for v in values if v is not None]


@dataclass
class Attribution:
    """Where retained tensors were created (`sites`), what holds them, the line seen adding
    to it (`growth`), and the lines the source stores into it with (`stores`, `stored_at`)."""

    sites: list[RetainedSite]
    holder: CheckHolder | None
    growth: GrowthLine | None
    checked_at_step: int | None
    stores: list[Site] = field(default_factory=list)
    stored_at: StoredAt | None = None
    foreign: bool = False  # the holder is an object of code outside the repo (a framework's)
    reach: list[list[int]] = field(default_factory=list)  # [step, tensors the holder reached] at each check
    passed_over: str | None = None  # a name seen holding the tensors whose reach did not grow: not named

    def record(self) -> AttributionRecord:
        return AttributionRecord(sites=self.sites, holder=self.holder, growth=self.growth, checked_at_step=self.checked_at_step, stores=self.stores, stored_at=self.stored_at)


def attribute(memory: MemoryRecord) -> Attribution:
    """Where retained tensors were created, what holds them, the line that adds to it."""
    checks = memory.checks
    with_sites = [c for c in checks if c.sites]
    latest = with_sites[-1] if with_sites else None
    holder, reach = growing_holder(checks)
    passed_over = None
    if holder is None:
        seen = next((c.holder for c in reversed(checks) if c.holder), None)
        passed_over = seen.description if seen else None
    growth = None
    if holder is not None:
        lines = [g for g in memory.growth_lines if g.holder == holder.description]
        if lines:
            shallowest = min(g.depth for g in lines)
            counted = Counter((g.site.path, g.site.line) for g in lines if g.depth == shallowest)
            (path, line), _ = counted.most_common(1)[0]
            growth = next(g for g in lines if (g.site.path, g.site.line) == (path, line))
    sites = latest.sites if latest else memory.retained_at_end
    return Attribution(sites[:6], holder, growth, latest.step if latest else None, reach=reach, passed_over=passed_over)


def growing_holder(checks: list[LeakCheck]) -> tuple[CheckHolder | None, list[list[int]]]:
    """The holder to name, with what it held at each check ([step, tensors reached], or the
    steps a named graph held): of the names found holding the retained tensors, the latest
    check's first, unless it was measured at two checks and did not grow. Then another name
    that grew (a local holding the last few steps beside the list that keeps them all), the
    one holding most; else none: a holder seen not to grow is not what leaks."""
    sizes: dict[str, list[list[int]]] = {}
    latest: dict[str, HolderRecord] = {}
    chosen: CheckHolder | None = None
    for check in checks:
        for found in [check.holder, *check.others] if check.holder else []:
            size = found.reach if found.reach is not None else found.steps
            if size is not None:
                sizes.setdefault(found.description, []).append([check.step, size])
            latest[found.description] = found
        chosen = check.holder or chosen
    if chosen is None:
        return None, []
    growing = [d for d, points in sizes.items() if len(points) >= 2 and all(b[1] > a[1] for a, b in pairwise(points))]
    own = sizes.get(chosen.description, [])
    if chosen.description in growing or (not growing and len(own) < 2):
        return chosen, own
    if not growing:
        return None, own
    best = max(growing, key=lambda d: sizes[d][-1][1])
    record = latest[best]
    named = record if isinstance(record, CheckHolder) else CheckHolder(**record.model_dump(exclude_unset=True), created_at=chosen.created_at)
    return named, sizes[best]


def _reach_text(reach: list[list[int]]) -> str:
    """`it reached 9 tensors at step 11 and 17 at step 19`."""
    return "it reached " + ", ".join(f"{n:,} tensor(s) at step {step}" for step, n in reach)


def _json(record: BaseModel) -> dict[str, Any]:
    """A payload record as the result's JSON had it: the keys the probe wrote."""
    return record.model_dump(mode="json", exclude_unset=True)


def _holder_key(holder: HolderRecord | None) -> str:
    """What holds the memory, as data (kind, owner, name), for the fingerprint."""
    if not holder:
        return ""
    return ":".join(str(part or "") for part in (holder.kind, holder.owner, holder.name))


def _graph_finding(ctx: StageContext, graph: HeldGraph, memory: MemoryRecord, device: str, host: LeakVerdict | None) -> Finding:
    holder = graph.holder
    (first_step, first), (last_step, last) = graph.points[0], graph.points[-1]
    per_step = (last - first) / max(1, last_step - first_step)
    spans = [p for p in graph.steps_held if p[1] is not None]
    site = graph_store(ctx, holder)
    location = location_of(site)
    code = site.code if site else ""
    # Past the walk cap the node counts stop moving; the steps held still grow.
    capped = per_step <= 0 and bool(spans)
    if capped and spans:
        grew = f"holds nodes made in {spans[0][1]} steps at step {spans[0][0]} and in {spans[-1][1]} at step {spans[-1][0]}"
        size = f"one step's graph has at least {graph.step_nodes:,} nodes"
    else:
        grew = f"grew from {first:,} nodes at step {first_step} to {last:,} at step {last_step} ({per_step:.0f} nodes per step)"
        size = f"one step's graph has {graph.step_nodes:,}"
    host_sentence = (
        f" The process's {memory.host_source or 'host memory'} grew {_bytes(host.slope_bytes_per_step)} per step over {host.steps} steps"
        f" (r^2 {host.r2:.2f}) while the tensor storages did not: that is the graph's nodes."
        if host is not None else ""
    )
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=f"An autograd graph held by {holder.description} grows every step",
        location=location,
        problem=(
            f"{holder.description} is a tensor whose autograd graph {grew}; {size}: it keeps every step's graph"
            + (f", stored at `{code}`" if code else "") + ". Backward frees the saved tensors, so the tensor bytes do not show it; the graph nodes stay."
            + host_sentence
        ),
        impact="The graph grows for the whole run: memory rises step after step, and a backward through this tensor would traverse every step.",
        fix="Accumulate a number, not the graph: `total += loss.item()` at logging intervals or `total += loss.detach()`.",
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=(
                (f"graph nodes from {spans[0][1]} -> {spans[-1][1]} steps between steps {spans[0][0]} and {spans[-1][0]}" if capped and spans else f"{first:,} -> {last:,} autograd nodes between steps {first_step} and {last_step}")
                + (f"; host memory +{_bytes(host.slope_bytes_per_step)}/step" if host is not None else "")
                + f" on {device}"
            ),
            data={
                "held_by": _json(holder), "nodes_at_step": graph.points, "steps_held_at_step": graph.steps_held, "nodes_per_step": round(per_step, 1),
                "one_step_graph_nodes": graph.step_nodes, "node_count_capped": capped, "stored_at": _json(site) if site else None, "device": device,
                "host_bytes_per_step": round(host.slope_bytes_per_step, 1) if host is not None else None, "host_measure": memory.host_source,
            },
        ),
        key=f"graph\x1f{_holder_key(holder)}\x1f{code}",
    )


def graph_store(ctx: StageContext, holder: GraphHolder) -> Site | None:
    """Where a held graph is stored into its name: the line that made the tensor's storage
    (`total = total + loss`), else the first store in the source (`total += loss` on a
    tensor made before the loop)."""
    return store_line(holder.created_at, storing_lines(ctx.root, holder))[0]


def store_line(seen: Site | None, stores: list[Site]) -> tuple[Site | None, bool]:
    """The line that stores into a holder, and whether the probe saw it: the line `seen`
    when the source stores there or has no store the parser recognises, else the first
    store found in the source."""
    if seen and (not stores or any((s.path, s.line) == (seen.path, seen.line) for s in stores)):
        return seen, True
    return (stores[0], False) if stores else (None, False)


def host_finding(ctx: StageContext, host: LeakVerdict, tensors: LeakVerdict, memory: MemoryRecord, device: str, loop_site: Location | None) -> Finding:
    """Host memory grows while no tensor storage or named graph does: measured, not located
    beyond the training loop."""
    source = memory.host_source or "host memory"
    return ctx.finding(
        category=CATEGORY,
        severity=severity_for(host, graph=False),
        title=f"Host memory held between steps grows {_bytes(host.slope_bytes_per_step)} per step",
        location=loop_site,
        problem=(
            f"The process's {source} grew from {_mib(host.start_bytes)} to {_mib(host.start_bytes + host.total_growth_bytes)} over {host.steps} steps "
            f"after warm-up: {_bytes(host.slope_bytes_per_step)} per step (r^2 {host.r2:.2f}, {host.increasing_fraction:.0%} of steps grew) on {device}. "
            f"The tensor storages did not grow ({tensors.reason}) and no named tensor was seen holding an autograd graph of several steps, "
            "so what holds it is not known: objects outside torch, or a graph reached through no name the probe looks at. "
            "The finding points at the training loop's model call."
        ),
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=f"+{host.total_growth_bytes:,.0f} bytes of {source} over {host.steps} steps, {host.slope_bytes_per_step:,.0f} bytes/step (Theil-Sen), r^2 {host.r2:.2f}",
            data={**host.record().data(), "measured_as": source, "tensor_bytes": tensors.record().data(), "device": device},
        ),
        key=f"host\x1f{source}",
    )


def stored_at(attribution: Attribution) -> StoredAt | None:
    """The line that stores into the holder: the one seen growing it when the source agrees
    (or has no store the parser recognises), else the first store found in the source."""
    site, seen = store_line(attribution.growth.site if attribution.growth else None, attribution.stores)
    if site is None:
        return None
    how = "observed growing the holder while one step was traced" + (" and found in the source" if attribution.stores else "") if seen else "found in the source: a store into the holder"
    return StoredAt(path=site.path, line=site.line, function=site.function, code=site.code, how=how)


def _location(attribution: Attribution) -> Location | None:
    holder, growth = attribution.holder, attribution.growth
    candidates: list[StoredAt | Site | None] = [
        attribution.stored_at,
        growth.site if growth else None,
        holder.created_at if holder else None,
        next((s.site for s in attribution.sites if s.site), None),
    ]
    return location_of(next((c for c in candidates if c), None))


def severity_for(verdict: LeakVerdict, graph: bool) -> Severity:
    large = (
        verdict.total_growth_bytes >= LARGE_FRACTION * max(verdict.start_bytes, 1.0)
        or verdict.slope_bytes_per_step >= LARGE_SLOPE_BYTES
        or graph
    )
    steady = verdict.r2 >= STEADY_R2 or (verdict.r2 >= MIN_R2 and verdict.mann_kendall_z >= STEADY_Z)
    return Severity.HIGH if steady and large else Severity.MEDIUM


def _problem(verdict: LeakVerdict, attribution: Attribution, device: str, kept: KeptGraphs | None, nodes: NodeGrowth | None) -> str:
    """The finding's problem statement: the growth, where the retained tensors were made,
    what holds them and where it is stored into, and the autograd nodes they keep."""
    holder = attribution.holder
    growth = attribution.growth
    graph = bool(holder and holder.graph)
    held_by = holder.description if holder else None
    stored = attribution.stored_at
    created = [f"{s.site.path}:{s.site.line} (`{s.site.code}`, {s.bytes:,} bytes from {s.steps} steps)" for s in attribution.sites if s.site][:3]
    sentences = [
        f"Memory held at the step boundary grew from {_mib(verdict.start_bytes)} to {_mib(verdict.start_bytes + verdict.total_growth_bytes)} "
        f"over {verdict.steps} steps after warm-up: {verdict.slope_bytes_per_step:,.0f} bytes per step (r^2 {verdict.r2:.2f}, "
        f"{verdict.increasing_fraction:.0%} of steps grew) on {device}."
    ]
    if created:
        sentences.append("The retained tensors were created at " + "; ".join(created) + ".")
    if holder and held_by:
        reference = f" (`{holder.reference}`)" if holder.reference else ""
        where = f", stored into at {stored.path}:{stored.line} `{stored.code}`" if stored else (f", which grows at `{growth.site.code}`" if growth else "")
        if stored and attribution.foreign:
            where = f", an object of code outside the repo (a framework's) that keeps what the repo's code hands it: it grew after {stored.path}:{stored.line} `{stored.code}`"
            where += "" if graph else ", with no autograd graph (what the framework keeps by design until it hands the outputs back, as for an epoch-end hook): low"
        sentences.append(f"They are held by {held_by}{reference}{where}.")
        if len(attribution.reach) >= 2 and holder.reach is not None:
            grew = all(b[1] > a[1] for a, b in pairwise(attribution.reach))
            sentences.append(f"Counted through its containers, {_reach_text(attribution.reach)}: " + ("it grows from check to check." if grew else "it did not grow at every check."))
    elif attribution.sites:
        if attribution.passed_over:
            sentences.append(
                f"{attribution.passed_over[0].upper() + attribution.passed_over[1:]} holds some of them, but what it holds did not grow from one check to the next "
                f"({', '.join(f'{n:,} at step {step}' for step, n in attribution.reach)}): it is not what keeps them, and no growing holder was reached, so the finding points at where they were created."
            )
        else:
            sentences.append("No holder was found (no named variable, global or attribute was reached from the retained tensors), so the finding points at where they were created.")
        if graph:
            sentences.append("The held tensors still carry their autograd graphs, so every step also keeps its graph nodes alive.")
    if kept is not None:
        counts = ", ".join(f"{p.storages} at step {p.step}" for p in kept.points)
        sentences.append(
            f"The tensor bytes alone stay under the {MIN_SLOPE_BYTES:.0f} bytes/step floor ({verdict.reason}), but the kept tensors, "
            f"each with its graph, keep accumulating: {counts}."
        )
    if nodes and nodes.per_step is not None:
        sentences.append(f"Autograd nodes held by {nodes.held_by}: {nodes.per_step:,.0f} more per step ({_points(nodes.points)}).")
    return " ".join(sentences)


def _finding(ctx: StageContext, verdict: LeakVerdict, attribution: Attribution, memory: MemoryRecord, device: str, kept: KeptGraphs | None = None, nodes: NodeGrowth | None = None) -> Finding:
    holder = attribution.holder
    growth = attribution.growth
    graph = bool(holder and holder.graph)
    location = _location(attribution)
    held_by = holder.description if holder else None
    stored = attribution.stored_at
    key_code = (stored.code if stored else "") or (growth.site.code if growth else "") or (location.function if location else "")
    return ctx.finding(
        category=CATEGORY,
        # What a framework keeps of the step's outputs with no graph (Lightning's outputs for
        # `training_epoch_end`) is its design, bounded by the epoch: reported, not a leak of the repo's.
        severity=Severity.HIGH if kept is not None else Severity.LOW if attribution.foreign and not graph else severity_for(verdict, graph),
        title=(
            f"{held_by[0].upper() + held_by[1:]} keeps every step's tensors with their autograd graphs"
            if kept is not None and held_by
            else f"Memory held between steps grows {_bytes(verdict.slope_bytes_per_step)} per step" + (f" ({held_by})" if held_by else "")
        ),
        location=location,
        problem=_problem(verdict, attribution, device, kept, nodes),
        evidence=Evidence(
            kind=EvidenceKind.MEASURED,
            summary=(
                f"+{verdict.total_growth_bytes:,.0f} bytes over {verdict.steps} steps, {verdict.slope_bytes_per_step:,.0f} bytes/step "
                f"(Theil-Sen), r^2 {verdict.r2:.2f}, Mann-Kendall z {verdict.mann_kendall_z:.1f}"
            ),
            data={
                **verdict.record().data(),
                "leak": True,
                "bytes_leak": verdict.leak,
                "nodes_per_step": nodes.per_step if nodes else None,
                "device": device,
                "measured_as": memory.source,
                "held_by": _json(holder) if holder else None,
                "grows_at": _json(growth.site) if growth else None,
                "stored_at": stored.data() if stored else None,
                "holder_reference": holder.reference if holder else None,
                "holder_found": holder is not None,
                "holder_reach_at_step": attribution.reach,
                "holder_not_growing": attribution.passed_over,
                "retained_by_creation_site": [_json(s) for s in attribution.sites],
                "kept_with_graphs": kept.data() if kept else None,
            },
        ),
        key=f"{_holder_key(holder)}\x1f{key_code}",
    )


def _points(points: list[list[int]]) -> str:
    return ", ".join(f"{n:,} at step {step}" for step, n in points)


def chart(held: list[int], warmup: int) -> Chart:
    """At most CHART_POINTS evenly spaced (step, KiB) points of the held-memory series."""
    if not held:
        return Chart(steps=[], kib=[], warmup=warmup)
    stride = max(1, -(-len(held) // CHART_POINTS))
    picks = list(range(0, len(held), stride))
    if picks[-1] != len(held) - 1:
        picks.append(len(held) - 1)
    return Chart(steps=[i + 1 for i in picks], kib=[round(held[i] / 1024, 2) for i in picks], warmup=warmup)


def table(held: list[int], warmup: int) -> list[TableRow]:
    if not held:
        return []
    stride = max(1, -(-len(held) // TABLE_ROWS))
    picks = list(range(0, len(held), stride))
    if picks[-1] != len(held) - 1:
        picks.append(len(held) - 1)
    return [TableRow(step=i + 1, bytes=held[i], delta=held[i] - held[picks[k - 1]] if k else 0, warmup=i < warmup) for k, i in enumerate(picks)]


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


def _bytes(n: float) -> str:
    if abs(n) >= 2**20:
        return f"{n / 2**20:.2f} MiB"
    if abs(n) >= 1024:
        return f"{n / 1024:.1f} KiB"
    return f"{n:.0f} bytes"

