"""What holds a leak's tensors, and the line that stores into it: the reference chain from a
named root, the static search for stores, and the stage end to end on a metrics tracker
that keeps every step's outputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.conftest import TARGETS, line_of
from tests.stages.performance.performance_runs import PERFORMANCE, Shared, metric, only
from traingate.stages.performance.probe.payloads import HolderRecord
from traingate.stages.performance.probe.frame_index import FrameIndex
from traingate.stages.performance.probe.holders import chain_keys, find_holder, live_tensors_with
from traingate.stages.performance.stores import storing_lines

TRACKER = TARGETS / "perf_leak_tracker"


class Keeper:
    def __init__(self) -> None:
        self._outputs: dict[int, dict[str, torch.Tensor]] = {}


def test_the_chain_names_each_key_from_the_root_down() -> None:
    keeper = Keeper()
    kept = torch.ones(3)
    keeper._outputs[4] = {"embeddings": kept}
    assert chain_keys([keeper._outputs[4], keeper._outputs], kept) == ["[<int>]", '["embeddings"]']
    assert chain_keys([[kept]], kept) == ["[<int>]"]


def test_a_detached_view_is_found_by_its_storage_and_its_holder_named() -> None:
    keeper = Keeper()
    for step in range(3):
        out = torch.randn(4, 4, requires_grad=True) * 2
        keeper._outputs[step] = {"embeddings": out.detach()}
    del out
    key = keeper._outputs[0]["embeddings"].untyped_storage()._cdata
    samples = live_tensors_with({key})
    assert len(samples) == 1 and samples[0] is keeper._outputs[0]["embeddings"]
    holder = find_holder(samples, [], FrameIndex(Path(__file__).parent))
    samples.clear()
    assert holder is not None and holder.kind == "attribute"
    assert holder.reference() == 'Keeper._outputs[<int>]["embeddings"]'


def test_stores_are_found_in_the_source_and_initialisation_is_not_one() -> None:
    tracker = HolderRecord.model_validate({
        "kind": "attribute", "name": "_outputs", "owner": "ClassificationTracker", "path": "train.py", "line": line_of(TRACKER / "train.py", "class ClassificationTracker"),
        "held_type": "dict", "chain": ["dict", "dict"], "graph": False, "description": "`self._outputs` (dict) of `ClassificationTracker`", "reference": 'ClassificationTracker._outputs[<int>]["embeddings"]',
    })
    stores = storing_lines(TRACKER, tracker)
    assert [s.line for s in stores] == [line_of(TRACKER / "train.py", "marker: tracker-store")]
    assert stores[0].function == "update"
    graph = TARGETS / "perf_leak_graph" / "train.py"
    losses = HolderRecord.model_validate({
        "kind": "local", "name": "losses", "owner": "train", "path": "train.py", "line": line_of(graph, "def train("),
        "held_type": "list", "chain": ["list"], "graph": True, "description": "local `losses` (list) in `train()`", "reference": "losses[<int>]",
    })
    local = storing_lines(graph.parent, losses)
    assert [s.line for s in local] == [line_of(graph, "marker: leak-append")]


@pytest.mark.slow
def test_a_tracker_keeping_every_steps_outputs_leaks_at_the_store(shared_gate: Shared) -> None:
    run = shared_gate("perf_leak_tracker", *PERFORMANCE)[0]
    assert run.returncode == 1
    leak = only(run, "memory-leak")
    assert leak["location"] == {"path": "train.py", "line": line_of(TRACKER / "train.py", "marker: tracker-store"), "function": "update"}
    data = leak["evidence"]["data"]
    assert data["holder_found"] and data["held_by"]["kind"] == "attribute" and data["held_by"]["owner"] == "ClassificationTracker"
    assert data["holder_reference"] in {'ClassificationTracker._outputs[<int>]["embeddings"]', 'ClassificationTracker._outputs[<int>]["logits"]'}
    assert data["stored_at"]["line"] == leak["location"]["line"]
    # The creation sites stay as supporting evidence: the model's forward.
    assert {s["site"]["function"] for s in data["retained_by_creation_site"]} == {"forward"}
    assert "ClassificationTracker._outputs[<int>]" in leak["problem"]
    md = (run.out / "performance.md").read_text()
    assert "ClassificationTracker._outputs[<int>]" in md and "stored into at `train.py:" in md
    assert metric(run, "memory held between steps")["passed"] is False


@pytest.mark.slow
def test_the_same_tracker_reset_every_step_holds_nothing(shared_gate: Shared) -> None:
    run = shared_gate("perf_leak_tracker_reset", *PERFORMANCE)[0]
    assert "memory-leak" not in run.categories(), [f["title"] for f in run.findings()]
    assert metric(run, "memory held between steps")["passed"] is True
