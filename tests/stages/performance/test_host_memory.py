"""Leaks that live in host memory (an autograd graph past the node-count cap, objects outside
torch): the host measure, the steps a held graph spans, and the verdict over both, in-process
and end to end on a loop whose step builds more than 10,000 autograd nodes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import TARGETS, GateRun, line_of
from tests.stages.performance.measurements import make_ctx, memory_record
from tests.stages.performance.performance_runs import PERFORMANCE
from traingate.pipeline.model.schema import Severity
from traingate.stages.performance import memory as perf_memory
from traingate.stages.performance.leak import HOST_MIN_SLOPE_BYTES
from traingate.stages.performance.probe.frame_index import MAX_WALK_NODES
from traingate.stages.performance.probe.graph_span import sequence_number, steps_held
from traingate.stages.performance.probe.holders import graph_tensors
from traingate.stages.performance.probe.host_memory import HostMemory


def test_the_host_measure_sees_memory_no_tensor_holds() -> None:
    host = HostMemory()
    assert host.source is not None
    before = host.read()
    kept = bytearray(8 << 20)  # 8 MiB outside torch: malloc'd by Python, so in the C heap
    after = host.read()
    assert before is not None and after is not None and after - before >= 7 << 20
    del kept


def test_a_running_total_holds_one_more_step_each_step_and_a_fresh_loss_one() -> None:
    weights = torch.nn.Parameter(torch.randn(4))
    total: Any = 0.0
    marks: list[int] = []
    held = []
    for _ in range(6):
        h = torch.randn(2, 4)
        for _ in range(50):
            h = torch.tanh(h * weights)
        loss = h.pow(2).mean()
        loss.backward()
        marks.append(sequence_number(loss.grad_fn))
        total += loss
        held.append(steps_held(total, marks))
    assert marks == sorted(marks) and marks[0] >= 0
    # The total made after step k's mark holds step k's graph, each earlier one and its own
    # node (counted with the step in progress): one step more each step.
    assert held[0] <= 2 and held == list(range(held[0], held[0] + 6))
    assert steps_held(loss, marks) == 1
    assert steps_held(total.detach(), marks) == 0


def test_a_list_keeping_each_steps_loss_holds_one_more_step_each_step() -> None:
    """`losses.append(loss)`: no single tensor holds more than its own step, the list holds
    them all; a list of numbers and a list of detached values hold none."""
    weights = torch.nn.Parameter(torch.randn(4))
    marks: list[int] = []
    losses: list[Any] = []
    held = []
    for _ in range(6):
        loss = torch.tanh(torch.randn(2, 4) * weights).pow(2).mean()
        loss.backward(retain_graph=True)
        marks.append(sequence_number(loss.grad_fn))
        losses.append(loss)
        kept = graph_tensors(losses)
        assert kept is not None
        held.append(steps_held(kept, marks))
    assert held == [1, 2, 3, 4, 5, 6]
    assert graph_tensors([loss.item() for loss in losses]) is None and graph_tensors([loss.detach() for loss in losses]) is None
    assert graph_tensors({"a": losses[0], "b": 1.0}) == [losses[0]] and graph_tensors(tuple(losses[:2])) == losses[:2]


def memory_payload(host: list[int], graphs: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    checks = [{"step": s, "span": s - 4, "sites": [], "holder": None, "graphs": [dict(g) for g in graphs or []]} for s in (11, 19)]
    return {
        "source": "live tensor storages (dispatch-mode registry)", "held_bytes": [4096] * len(host), "checks": checks,
        "growth_lines": [], "step_graph_nodes": 10_000, "host_source": "host heap in use (glibc mallinfo2)", "host_bytes": host,
        "peak_tracked_bytes": 8192, "storages_registered": 100, "retained_at_end": [],
    }


def test_host_growth_nothing_explains_is_a_leak_at_the_training_loop(tmp_path: Path) -> None:
    from traingate.pipeline.model.schema import Location

    loop = Location(path="train.py", line=12, function="train")
    growing = [50_000_000 + 2_000_000 * i for i in range(20)]
    details, [finding] = perf_memory.analyse(make_ctx(tmp_path), memory_record(memory_payload(growing)), 3, 8, "cpu", loop)
    assert finding.category.value == "memory-leak" and finding.severity is Severity.HIGH
    assert finding.location == loop and finding.evidence.kind.value == "measured"
    assert details.verdict.leak and not details.verdict.bytes_leak and details.verdict.host is not None and details.verdict.host.leak
    # Under the host floor, and a one-off jump: no leak.
    small = [50_000_000 + int(HOST_MIN_SLOPE_BYTES / 4) * i for i in range(20)]
    jump = [50_000_000] * 10 + [58_000_000] * 10
    for series in (small, jump):
        details, found = perf_memory.analyse(make_ctx(tmp_path), memory_record(memory_payload(series)), 3, 8, "cpu", loop)
        assert found == [] and not details.verdict.leak, details.verdict.reason


def test_a_graph_past_the_node_cap_is_followed_by_the_steps_it_holds(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("def train(loss):\n    total = 0\n    for _ in range(9):\n        total += loss\n")
    graph = {
        "description": "local `total` (tensor with its autograd graph) in `train()`", "kind": "local", "name": "total", "owner": "train",
        "path": "train.py", "line": 1, "created_at": {"path": "train.py", "line": 2, "function": "train", "code": "total = 0"},
        "held_type": "Tensor", "chain": [], "graph": True, "reference": "total",
    }
    host = [50_000_000 + 6_000_000 * i for i in range(20)]
    payload = memory_payload(host, [{**graph, "nodes": 10_000, "steps": 0}])
    payload["checks"][0]["graphs"][0]["steps"], payload["checks"][1]["graphs"][0]["steps"] = 11, 19
    details, [finding] = perf_memory.analyse(make_ctx(tmp_path), memory_record(payload), 3, 8, "cpu")
    # Located at the store into the name, not where its storage was first made.
    assert (finding.location.path, finding.location.line) == ("train.py", 4)
    assert finding.evidence.data["node_count_capped"] and finding.evidence.data["host_bytes_per_step"] >= 5_000_000
    assert "11 steps at step 11 and in 19 at step 19" in finding.problem
    assert details.verdict.nodes.steps_held == [[11, 11], [19, 19]]
    # The same size, the same two steps held at each check: a graph that does not grow.
    steady = memory_payload([50_000_000] * 20, [{**graph, "nodes": 10_000, "steps": 2}])
    assert perf_memory.analyse(make_ctx(tmp_path), memory_record(steady), 3, 8, "cpu")[1] == []


@pytest.fixture
def heavy_leak(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("perf_leak_heavy_graph", *PERFORMANCE)[0]


@pytest.mark.slow
def test_a_running_total_over_a_10000_node_step_blocks_at_the_storing_line(heavy_leak: GateRun) -> None:
    assert heavy_leak.returncode == 1 and heavy_leak.report["decision"] == "BLOCK"
    [leak] = heavy_leak.findings("memory-leak")
    train = TARGETS / "perf_leak_heavy_graph" / "train.py"
    assert leak["location"]["path"] == "train.py" and leak["location"]["line"] == line_of(train, "marker: leak-heavy-graph")
    assert leak["severity"] == "high" and leak["blocking"] and leak["evidence"]["kind"] == "measured"
    data = leak["evidence"]["data"]
    assert data["held_by"]["name"] == "running_loss" and data["node_count_capped"]
    assert data["one_step_graph_nodes"] >= 10_000 and data["host_bytes_per_step"] >= 1 << 20
    host = next(m for m in heavy_leak.stage("performance")["metrics"] if m["id"] == "memory.host_growth")
    assert host["passed"] is False and host["value"] >= 1 << 20


@pytest.fixture
def heavy_clean(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("perf_heavy_graph_clean", *PERFORMANCE)[0]


@pytest.mark.slow
def test_the_same_loop_summing_numbers_has_no_leak(heavy_clean: GateRun) -> None:
    assert heavy_clean.findings("memory-leak") == [], [f["title"] for f in heavy_clean.findings()]
    host = next(m for m in heavy_clean.stage("performance")["metrics"] if m["id"] == "memory.host_growth")
    assert host["passed"] is True and host["value"] < HOST_MIN_SLOPE_BYTES


@pytest.mark.slow
def test_a_step_graph_past_the_walk_cap_is_counted_up_to_it_and_says_so(heavy_clean: GateRun) -> None:
    """One step's graph (about 10,400 nodes) is past MAX_WALK_NODES: the walk stops at the cap,
    the run says the count is a lower bound, and the node-growth metric's note says graphs are
    not followed by node count on this loop."""
    performance = heavy_clean.stage("performance")
    window = performance["details"]["instrumentation"]
    assert window["graph_walk_capped"] is True and window["graph_walk_cap"] == MAX_WALK_NODES
    nodes = next(m for m in performance["metrics"] if m["id"] == "memory.graph_nodes_growth")
    assert f"at least {MAX_WALK_NODES:,} nodes" in (nodes["note"] or "")
