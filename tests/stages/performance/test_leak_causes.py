"""Leaks named at their cause, end to end: the holder whose reach grows (`losses`, not the
local holding its last three steps), and a graph released at every epoch's end (followed at
every step, so checks eight steps apart on an eight-step epoch do not read it flat), each
with a clean control; and the choice of the growing holder on synthetic checks."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import TARGETS, GateRun, line_of
from traingate.stages.performance.memory import growing_holder
from traingate.stages.performance.probe.payloads import LeakCheck

Shared = Callable[..., tuple[GateRun, float]]


PERFORMANCE = ("--stages", "performance")


def _marker(case: str, name: str) -> tuple[str, int]:
    return "train.py", line_of(TARGETS / case / "train.py", f"# marker: {name}")


def _located(finding: dict) -> tuple[str, int]:
    return finding["location"]["path"], finding["location"]["line"]


@pytest.mark.slow
def test_the_list_that_keeps_every_step_is_named_not_the_local_holding_the_last_three(shared_gate: Shared) -> None:
    run = shared_gate("perf_leak_list_window", *PERFORMANCE)[0]
    [finding] = run.findings("memory-leak")
    assert finding["severity"] == "high" and run.report["decision"] == "BLOCK"
    assert _located(finding) == _marker("perf_leak_list_window", "leak-append")
    data = finding["evidence"]["data"]
    assert data["held_by"]["name"] == "losses" and "recent" not in finding["title"]
    reach = data["holder_reach_at_step"]
    assert len(reach) >= 2 and all(b[1] > a[1] for a, b in zip(reach, reach[1:], strict=False))
    assert "it grows from check to check" in finding["problem"] and "`losses.append(loss)" in finding["problem"]


@pytest.mark.slow
def test_a_graph_released_at_every_epochs_end_is_a_leak_scaling_with_the_epoch(shared_gate: Shared) -> None:
    case = "perf_leak_epoch_total"
    run = shared_gate(case, *PERFORMANCE)[0]
    [finding] = run.findings("memory-leak")
    assert finding["severity"] == "high" and finding["blocking"] is True  # it grows as long as an epoch does
    assert _located(finding) == _marker(case, "epoch-total")
    data = finding["evidence"]["data"]
    assert data["held_by"]["name"] == "total" and data["epoch_steps"] == 8  # 64 samples / batch 8
    assert data["released_at_steps"][:3] == [9, 17, 25] and data["peak_steps_held"] >= 7
    assert data["longer_epoch_steps"] == 80 and data["projected_bytes_at_longer_epoch"] == pytest.approx(10 * data["projected_bytes_at_epoch"])
    assert "scales with the epoch's length" in finding["title"]
    assert "epoch length (8 steps)" in finding["problem"] and "10 times longer (80 steps)" in finding["problem"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["perf_leak_list_window_clean", "perf_leak_epoch_total_clean"])
def test_the_same_loops_keeping_numbers_have_no_leak(shared_gate: Shared, case: str) -> None:
    run = shared_gate(case, *PERFORMANCE)[0]
    assert run.findings("memory-leak") == []
    assert run.stage("performance")["details"]["memory"]["verdict"]["leak"] is False


def _holder(name: str, reach: int) -> dict:
    return {
        "kind": "local", "name": name, "owner": "train", "path": "train.py", "line": 3, "held_type": "list", "chain": ["list"], "graph": True,
        "description": f"local `{name}` (list) in `train()`", "reference": name, "reach": reach,
    }


def test_a_holder_that_does_not_grow_gives_way_to_one_that_does() -> None:
    checks = [
        LeakCheck.model_validate({"step": step, "span": step, "sites": [], "graphs": [], "holder": {**_holder("recent", 3), "created_at": None}, "others": [_holder("losses", step)]})
        for step in (11, 19, 35)
    ]
    holder, reach = growing_holder(checks)
    assert holder is not None and holder.name == "losses" and reach == [[11, 11], [19, 19], [35, 35]]


def test_the_named_holder_stays_when_it_grows_or_was_seen_once() -> None:
    grows = [LeakCheck.model_validate({"step": s, "span": s, "sites": [], "graphs": [], "holder": {**_holder("losses", s), "created_at": None}}) for s in (11, 19)]
    assert growing_holder(grows)[0].name == "losses"  # type: ignore[union-attr]
    once = [LeakCheck.model_validate({"step": 11, "span": 11, "sites": [], "graphs": [], "holder": {**_holder("cache", 8), "created_at": None}})]
    assert growing_holder(once)[0].name == "cache"  # type: ignore[union-attr]  # seen once: nothing to verify it against


def test_a_holder_seen_not_to_grow_is_not_named_when_nothing_else_grows() -> None:
    """A smoothed loss over the last three steps (a graph of three steps at every check) holds
    some retained tensors but is not what keeps them: naming it would send the reader to it."""
    graph = {**_holder("smoothed", 0), "held_type": "tensor with its autograd graph", "chain": [], "reach": None, "steps": 3, "created_at": None}
    checks = [LeakCheck.model_validate({"step": s, "span": s, "sites": [], "graphs": [], "holder": graph}) for s in (11, 19, 35)]
    assert growing_holder(checks) == (None, [[11, 3], [19, 3], [35, 3]])
