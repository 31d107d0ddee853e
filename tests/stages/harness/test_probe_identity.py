"""The probes tell apart two objects of the target that had the same id(): CPython gives a freed
object's id to the next object allocated at its address (a GradScaler made, dropped and made
again). Each test makes that happen first, then asks the probe; the probes' methods are called
directly, without installing them (installing would patch this process's torch)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any
from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from traingate.stages.concurrency.probe.cuda import NonBlockingWatch  # noqa: E402
from traingate.stages.harness.sites import SiteTable  # noqa: E402
from traingate.stages.concurrency.probe.trace import ProtocolTrace  # noqa: E402
from traingate.stages.correctness.probe.gradients import StaleGradientWatch  # noqa: E402
from traingate.stages.harness.identity import ObjectMap  # noqa: E402

HERE = Path(__file__).parent
ATTEMPTS = 1000  # a freed object's id is normally taken by the first or second object made after it


def _id_reused(start: Callable[[], Any], make: Callable[[], Any], remember: Callable[[Any, Any], None]) -> tuple[Any, Any]:
    """Until a new object takes a freed one's id(): a fresh recorder (`start`), an object made
    (`make`), shown to it (`remember`) and freed, then another object made. Returns the recorder
    and that second object, which has the first one's id."""
    for _ in range(ATTEMPTS):
        recorder = start()
        first = make()
        first_id = id(first)
        remember(recorder, first)
        del first
        second = make()
        if id(second) == first_id:
            return recorder, second
    pytest.fail(f"no object took a freed one's id() in {ATTEMPTS} attempts")


def _trace() -> ProtocolTrace:
    trace = ProtocolTrace()
    trace.sites = SiteTable(HERE)
    return trace


def _scaler() -> Any:
    return torch.amp.GradScaler("cpu", enabled=False)


def test_protocol_trace_counts_a_scaler_made_at_a_freed_ones_id_as_another_scaler() -> None:
    trace, second = _id_reused(_trace, _scaler, lambda trace, first: trace._scaler_index(first))
    assert trace._scaler_index(second) == 1
    assert trace._scaler_index(second) == 1  # and the same scaler again is still that one
    assert [s["index"] for s in trace.collect()["scalers"]] == [0, 1]


def test_protocol_trace_counts_an_optimizer_made_at_a_freed_ones_id_as_another_optimizer() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    trace, second = _id_reused(_trace, lambda: torch.optim.SGD([weight], lr=0.1), lambda trace, first: trace._optimizer_index(first))
    assert trace._optimizer_index(second) == 1
    assert trace.collect()["optimizers"] == 2
    assert trace._owners([weight], torch) == [1]  # the freed optimizer owns nothing any more


def test_stale_gradient_watch_numbers_an_optimizer_made_at_a_freed_ones_id_anew() -> None:
    weight = torch.nn.Parameter(torch.ones(3))

    def start() -> StaleGradientWatch:
        watch = StaleGradientWatch()
        watch.torch = torch
        watch.sites = SiteTable(HERE)
        return watch

    def step(watch: StaleGradientWatch, optimizer: Any) -> None:
        watch._before_backward()
        (weight * 2).sum().backward()
        optimizer.step()
        watch._post(optimizer, (), {})

    watch, second = _id_reused(start, lambda: torch.optim.SGD([weight], lr=0.1), step)
    step(watch, second)
    step(watch, second)
    # Judged at its own second step only, as optimizer 1: not at its first, against the freed
    # optimizer's step.
    assert [(j.step, j.optimizer) for j in watch.judged] == [(2, 1)]


def test_nonblocking_watch_ignores_a_storage_allocated_where_a_pending_copys_was_freed() -> None:
    """The same hazard by address: the pending copies are keyed by storage pointer."""
    for _ in range(ATTEMPTS):
        watch = NonBlockingWatch()
        watch.sites = SiteTable(HERE)
        copied = torch.zeros(1000)
        watch.copied(copied)  # never read, then freed
        pointer = copied.untyped_storage().data_ptr()
        del copied
        other = torch.zeros(1000)
        if other.untyped_storage().data_ptr() == pointer:
            break
    else:
        pytest.fail(f"no storage took a freed one's address in {ATTEMPTS} attempts")
    watch.check_read(other, ".tolist()")
    assert watch.races == []
    watch.copied(other)
    watch.check_read(other[1:], ".tolist()")  # a view of a pending copy still races
    assert [r["read_by"] for r in watch.races] == [".tolist()"]


class _Unhashable:
    def __eq__(self, other: object) -> bool:  # defining __eq__ alone removes __hash__
        return True


def test_object_map_answers_only_for_the_object_an_entry_was_made_for() -> None:
    found: ObjectMap[str] = ObjectMap()
    a, b = _Unhashable(), torch.ones(2)  # unhashable; __eq__ elementwise
    found[a], found[b] = "a", "b"
    assert found.get(a) == "a" and found.get(b) == "b" and _Unhashable() not in found
    assert sorted(found.values()) == ["a", "b"]
    del a
    gc.collect()
    assert found.values() == ["b"] and len(found._entries) == 1  # a freed object's entry goes
    assert found.pop(b) == "b" and b not in found and found.get(b, "none") == "none"


def test_object_map_holds_an_object_without_weak_references_only_when_asked() -> None:
    kept: ObjectMap[int] = ObjectMap()
    weak_only: ObjectMap[int] = ObjectMap(keep_alive=False)
    listed: list[int] = []  # a list takes no weak reference
    before = sys.getrefcount(listed)
    kept[listed] = 1
    weak_only[listed] = 2
    assert kept.get(listed) == 1 and sys.getrefcount(listed) == before + 1  # held: its id stays its own
    assert weak_only.get(listed) is None  # a probe measuring memory keeps nothing alive
