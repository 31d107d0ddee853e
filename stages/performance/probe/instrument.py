"""The performance stage's instruments, as the entrypoint harness loads them.

- `light`: only the step clock (optimizer/forward/backward hooks, DataLoader timing, the
  loss). Used for the timing runs, whose step times must not carry instrumentation costs.
- `full`: the step clock plus the storage tracker (a dispatch mode), the sync counter, the
  main-thread sampler and, at a few step boundaries, the search for what holds retained
  tensors. Used once per stage run.

The tracker and the sync counter cost a few microseconds per operator. On a loop whose step
runs more than `HEAVY_OPS_PER_STEP` operators (a long chain of small ones: a label model
with 50,000 autograd nodes) that multiplies the step time several times over, so there they
are switched off once the window the leak and sync verdicts need is covered: warm-up plus
max(min_steps, `WINDOW_STEPS`) steps. The window ends sooner, after max(min_steps,
`STEADY_WINDOW_STEPS`) steps past warm-up, when those steps show nothing for a longer one to
find: the held memory has not moved (by `STEADY_BYTES` in all), no storage made after
warm-up outlives the step after the one that made it, no check found retained tensors or a
graph held across steps, and every step made the same syncs at the same sites. The step
clock and the sampler keep running; the held memory series, the checks and the sync counts
end with the window, and the run reports how many steps were instrumented and why the
window ended where it did.
"""

from __future__ import annotations

import os
import time
from itertools import pairwise
from statistics import median
from typing import Any

import torch

from .clock import StepClock
from .frame_index import MAX_WALK_NODES, FrameIndex, site_with_code
from .host_memory import HostMemory
from .graph_span import SPAN_BUDGET
from .holders import GrowthTracer, Holder, find_holders, graph_spans, held_graph_nodes, live_tensors_with, named_graphs, target_stack
from .sampler import Sampler
from .syncs import SyncCounter
from .tracker import Entry, Tracker

# Post-warm-up step counts at which retained tensors are attributed (each costs a few
# gc scans, so only a handful per run).
CHECKPOINTS = (8, 16, 32, 64, 128, 256, 512)
MIN_STEPS_COVERED = 4
# Checks that may scan every tracked object for the tensors holding retained storages.
MAX_OBJECT_SCANS = 2
COVERAGE = 0.75
# Operators per step above which the per-operator instruments run for a bounded window only
# (tens of milliseconds of instrumentation per step from this size on), and that window's
# length after warm-up.
HEAVY_OPS_PER_STEP = 10_000
WINDOW_STEPS = 16
# The shortest window after warm-up on a heavy loop, taken when its steps are steady (an
# instrumented step of a 50,000-node chain costs about four bare ones:
# benchmarks/perf_heavy_graph.py).
STEADY_WINDOW_STEPS = 8
# Total movement of the held memory a steady window allows: the leak analysis's floor per
# step (MIN_SLOPE_BYTES in stages/performance/leak.py, which the probe does not import).
STEADY_BYTES = 64
# Median growth of the host memory per step a steady window allows: the host measure's floor
# (HOST_MIN_SLOPE_BYTES in stages/performance/leak.py). A median, since each check leaves
# a one-off 70-130 KiB of the probe's own.
STEADY_HOST_BYTES = 16 * 1024
# Named autograd graphs are looked at every step boundary after warm-up, not only at the
# checks (whose strides may divide an epoch's length and see a graph released at every epoch
# end at one phase only): a short descent per named graph (SCAN_BUDGET nodes) until one holds
# TRACK_STEPS steps, then the full descent for it at every boundary.
SCAN_BUDGET = 16
TRACK_STEPS = 3
MAX_TRACKED = 3
MAX_SPAN_POINTS = 2000


class LightProbe:
    def __init__(self) -> None:
        self.clock: StepClock | None = None
        self.cpu_marks: list[float] = []  # process CPU time at install, then at each step's end

    def install(self, ctx: Any) -> None:
        eager = None if torch.cuda.is_available() else (lambda t: float(t))
        self.clock = StepClock(FrameIndex(ctx.root), read_loss=eager)
        self.cpu_marks = [time.process_time()]
        self.clock.listeners.append(lambda _step: self.cpu_marks.append(time.process_time()))
        self.clock.install()

    def collect(self) -> dict[str, Any]:
        from .payloads import LightPayload  # at collect(): no start-up cost

        assert self.clock is not None
        clock = self.clock.collect()
        return LightPayload.sent({"clock": clock, "process": self._process(clock["training_device"])})

    def _process(self, device: str) -> dict[str, Any]:
        marks = self.cpu_marks
        name = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else None
        build = torch.__version__ + (f" cuda {torch.version.cuda}" if torch.version.cuda else "")
        # The whole process's CPU time since it started (a warm fork's starts at the fork), the
        # DataLoader workers it has reaped included: what the stage subtracts from the machine's.
        spent = sum(os.times()[:4])
        return {"cpu_step": [b - a for a, b in pairwise(marks)], "cpu_s": spent, "torch": build, "device_name": name}


class FullProbe:
    def __init__(self) -> None:
        self.root: Any = None
        self.warmup = 3
        self.series: list[int] = []
        self.host_series: list[int] = []  # the process's host memory at the same boundaries
        self.checks: list[dict[str, Any]] = []
        self.growth: list[dict[str, Any]] = []
        self._tracer: GrowthTracer | None = None
        self._tracer_holder: Holder | None = None
        self._instrument_s = 0.0
        self._object_scans = MAX_OBJECT_SCANS
        self.min_steps = 8
        self.ops_per_step: int | None = None  # operators in the last warm-up step
        self.window_end: int | None = None  # step count at which per-operator work stops; None: never
        self.window_planned: int | None = None  # the full window's end on a heavy loop
        self.ended_steady = False  # the window ended early: its steps were steady
        self._ops_mark = 0
        self.spans: dict[str, dict[str, Any]] = {}  # description -> {"holder": record, "points": [[step, steps held]]}

    def install(self, ctx: Any) -> None:
        self.root = ctx.root
        self.warmup = int(ctx.options.get("warmup_steps", 3))
        self.min_steps = int(ctx.options.get("min_steps", self.min_steps))
        self.frames = FrameIndex(ctx.root)
        self.clock = StepClock(self.frames, measure_graph=True)
        self.syncs = SyncCounter(self.frames, self.clock)
        self.clock.read_loss = self.syncs.read_scalar
        self.tracker = Tracker(self.frames, self.clock, self.syncs)
        self.syncs.bound, self.syncs.mark_bound = self.tracker.bound, self.tracker.mark_bound
        self.sampler = Sampler(self.frames, self.clock)
        self.host = HostMemory()
        self.clock.listeners.append(self._on_step)
        self.clock.install()
        self.syncs.install()
        self.tracker.install()
        self.sampler.start()

    # -- at each step boundary ----------------------------------------------------------
    def _on_step(self, completed: int) -> None:
        started = time.perf_counter()
        if self._tracer is not None:
            self._finish_tracer()  # first: tracing keeps a snapshot of the loop's locals
        if self.tracker.active:
            self.series.append(self.tracker.held_bytes(self.clock.training_device))
            host = self.host.read()
            if host is not None:
                self.host_series.append(host)
            if completed > self.warmup and self.clock.seq_marks:
                self._follow_graphs(completed)
            if completed - self.warmup in CHECKPOINTS:
                self._checkpoint(completed)
            self._plan_window(completed)
        self._instrument_s += time.perf_counter() - started

    def _plan_window(self, completed: int) -> None:
        """At the end of warm-up, size the loop by the operators its last warm-up step ran;
        on a heavy loop, end the per-operator work once its window is covered."""
        step_ops, self._ops_mark = self.tracker.ops - self._ops_mark, self.tracker.ops
        if self.ops_per_step is None and completed >= max(1, self.warmup):
            self.ops_per_step = step_ops
            if step_ops > HEAVY_OPS_PER_STEP:
                self.window_end = self.window_planned = self.warmup + max(self.min_steps, WINDOW_STEPS)
        if self.window_end is None:
            return
        if self.warmup + max(self.min_steps, STEADY_WINDOW_STEPS) <= completed < self.window_end and self._steady(completed):
            self.window_end, self.ended_steady = completed, True
        if completed >= self.window_end:
            self.tracker.pause()
            self.syncs.stop(completed)

    def _steady(self, completed: int) -> bool:
        """Whether the steps since warm-up leave a longer window nothing to find: held memory
        flat, nothing made after warm-up kept past the next step, no retained tensors or
        graphs at the checks, the same syncs at every step."""
        held, host = self.series[self.warmup :], self.host_series[self.warmup :]
        if not held or max(held) - min(held) >= STEADY_BYTES or self._tracer is not None:
            return False
        if len(host) > 1 and median(b - a for a, b in pairwise(host)) >= STEADY_HOST_BYTES:
            return False
        if any(c["sites"] or c["holder"] or c["graphs"] for c in self.checks):
            return False
        device = "cpu" if not self.clock.training_device.startswith("cuda") else "cuda"
        if self.tracker.survivors(self.warmup, completed - 2, device):
            return False
        return self.syncs.steady(self.warmup, completed - 1)

    def _checkpoint(self, now: int) -> None:
        """Which creation sites have tensors surviving from most earlier steps, and what
        holds them. The step just finished and the one before are left out: their tensors
        may still be bound to the loop's variables."""
        first, last = self.warmup, now - 2
        span = last - first + 1
        device = "cpu" if not self.clock.training_device.startswith("cuda") else "cuda"
        groups = self.tracker.survivors(first, now - 1, device)
        sites = []
        for site, entries in groups.items():
            covered = {e.step for e in entries if e.step <= last}
            if len(covered) >= max(MIN_STEPS_COVERED, COVERAGE * span):
                sites.append((site, entries, covered))
        sites.sort(key=lambda s: -sum(e.nbytes for e in s[1]))
        check: dict[str, Any] = {
            "step": now,
            "span": span,
            "sites": [
                {"site": site_with_code(site, self.root), "storages": len(entries), "bytes": sum(e.nbytes for e in entries), "steps": len(covered)}
                for site, entries, covered in sites[:8]
            ],
            "holder": None,
            "graphs": self._graphs(),
        }
        if sites:
            samples = _samples(sites, last)
            stack = target_stack(self.frames)
            holders = find_holders(samples, stack, self.frames, self.clock.step_graph_nodes, self.clock.seq_marks) if samples else []
            if not holders and self._object_scans > 0:
                # The tensors first seen with these storages are gone, or what still holds them
                # is not the leak (a cycle awaiting collection): what keeps the storages is
                # another tensor object (a detached view). One scan finds it.
                self._object_scans -= 1
                samples = live_tensors_with(_storage_keys(sites, last))
                holders = find_holders(samples, stack, self.frames, self.clock.step_graph_nodes, self.clock.seq_marks)
            del samples
            holder = holders[0] if holders else None
            if len(holders) > 1:
                # The other names holding the same tensors, with what each reaches: the stage
                # names the one whose reach grows from check to check.
                check["others"] = [h.record() for h in holders[1:6]]
            for other in holders[1:]:
                other.tensor, other.containers = None, []
            del holders
            if holder is not None:
                check["holder"] = holder.record()
                check["holder"]["created_at"] = site_with_code(self.tracker.site_of(holder.tensor), self.root)
                if holder.graph and holder.containers:
                    # The nodes the kept tensors' graphs hold: the second measure of the leak.
                    check["holder"]["nodes"] = held_graph_nodes(holder.containers[-1], limit=self._node_limit())
                holder.tensor = None
                if holder.containers:
                    tracer = GrowthTracer(self.frames, holder.containers)
                    if tracer.arm(target_stack(self.frames)):
                        self._tracer, self._tracer_holder = tracer, holder
        self.checks.append(check)

    def _follow_graphs(self, completed: int) -> None:
        """The steps each named graph holds at this boundary, for those that held TRACK_STEPS."""
        held: dict[str, int] = {}
        for steps, holder in graph_spans(target_stack(self.frames), self.frames, self.clock.seq_marks, SCAN_BUDGET, set(self.spans), SPAN_BUDGET):
            key = holder.describe()
            held[key] = max(steps, held.get(key, 0))
            if key not in self.spans and steps >= TRACK_STEPS and len(self.spans) < MAX_TRACKED:
                self.spans[key] = {"holder": holder.record(), "points": []}
        for key, series in self.spans.items():
            if len(series["points"]) < MAX_SPAN_POINTS:
                series["points"].append([completed, held.get(key, 0)])

    def _node_limit(self) -> int:
        return max(1, self.clock.step_graph_nodes) * 5000

    def _graphs(self) -> list[dict[str, Any]]:
        """Named tensors whose autograd graph spans several steps, with its size now."""
        out = []
        for nodes, holder in named_graphs(target_stack(self.frames), self.frames, self.clock.step_graph_nodes, marks=self.clock.seq_marks)[:3]:
            record = holder.record()
            # In GraphHolder's order: the payload is that model's dump (`Payload.sent`).
            record["created_at"] = site_with_code(self.tracker.site_of(holder.tensor), self.root)
            record["nodes"] = nodes
            holder.tensor = None
            out.append(record)
        return out

    def _finish_tracer(self) -> None:
        assert self._tracer is not None and self._tracer_holder is not None
        holder = self._tracer_holder
        chain = [type(c).__name__ for c in holder.containers]
        for index, site in sorted(self._tracer.disarm().items()):
            self.growth.append({"holder": holder.describe(), "container": chain[index], "depth": index, "site": site_with_code(site, self.root)})
        self._tracer = self._tracer_holder = None
        holder.containers = []

    # -- results ------------------------------------------------------------------------
    def collect(self) -> dict[str, Any]:
        self.tracker.uninstall()
        self.sampler.stop()
        if self._tracer is not None:
            self._tracer.disarm()
        # Imported here, once the instruments stopped: no start-up cost, nothing sampled or tracked.
        from .payloads import FullPayload

        clock = self.clock.collect()
        steps = clock["steps"]
        device = "cuda" if self.clock.training_device.startswith("cuda") else "cpu"
        return FullPayload.sent({
            "clock": clock,
            "memory": {
                "source": "torch.cuda.memory_allocated" if device == "cuda" else "live tensor storages (dispatch-mode registry)",
                "held_bytes": self.series,
                "host_source": self.host.source,
                "host_bytes": self.host_series,
                "peak_tracked_bytes": self.tracker.peak_bytes,
                "storages_registered": self.tracker.registered,
                "checks": self.checks,
                "step_graph_nodes": self.clock.step_graph_nodes,
                "growth_lines": self.growth,
                "retained_at_end": self._retained_at_end(steps, device),
                "graph_steps": list(self.spans.values()),
            },
            "syncs": self.syncs.collect(),
            "amp": self.tracker.amp_record(),
            "sampler": self.sampler.collect(steps),
            "instrument_s": round(self._instrument_s, 4),
            "instrumentation": {
                "ops_per_step": self.ops_per_step,
                "heavy_ops_per_step": HEAVY_OPS_PER_STEP,
                "window_end": self.window_end,
                "window_planned": self.window_planned,
                "ended_steady": self.ended_steady,
                # Steps whose operators the tracker and sync counter saw.
                "instrumented_steps": steps if self.window_end is None else min(steps, self.window_end),
                # One step's graph was counted up to the walk cap: its size is "at least" this.
                "graph_walk_capped": self.clock.step_graph_nodes >= MAX_WALK_NODES,
                "graph_walk_cap": MAX_WALK_NODES,
            },
        })

    def _retained_at_end(self, steps: int, device: str) -> list[dict[str, Any]]:
        groups = self.tracker.survivors(self.warmup, max(self.warmup, steps - 1), device)
        rows: list[dict[str, Any]] = []
        for site, entries in groups.items():
            rows.append({"site": site_with_code(site, self.root), "storages": len(entries), "bytes": sum(e.nbytes for e in entries), "steps": len({e.step for e in entries})})
        return sorted(rows, key=lambda r: -r["bytes"])[:8]


def _samples(sites: list[tuple[Any, list[Entry], set[int]]], last: int) -> list[torch.Tensor]:
    """A few retained tensors per accumulating site, newest first up to step `last` (the
    latest steps' tensors are still the loop's own variables), that still have a Python
    object (activations saved in a graph often have none)."""
    out: list[torch.Tensor] = []
    for _, entries, _ in sites[:4]:
        taken = 0
        for entry in sorted((e for e in entries if e.step <= last), key=lambda e: -e.step):
            tensor = entry.tensor() if entry.tensor is not None else None
            if tensor is not None:
                out.append(tensor)
                taken += 1
                if taken == 3:
                    break
    return out


def _storage_keys(sites: list[tuple[Any, list[Entry], set[int]]], last: int) -> set[int]:
    """The storages of the newest few retained entries (up to step `last`) of each
    accumulating site."""
    keys: set[int] = set()
    for _, entries, _ in sites[:4]:
        for entry in sorted((e for e in entries if e.step <= last), key=lambda e: -e.step)[:3]:
            storage = entry()
            if storage is not None:
                keys.add(storage._cdata)
    return keys


def light() -> LightProbe:
    return LightProbe()


def full() -> FullProbe:
    return FullProbe()
