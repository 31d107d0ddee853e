"""The suite's step counter, in-process: a `training` event per test that stepped, and while a
long test trains, a `stepping` event at most once a second (what tells a suite stopped inside a
training test from one that hung)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from traingate.stages.contract.pytest_events import SteppingEvent, TrainingEvent
from traingate.stages.execution.probe import pytest_steps


def test_a_long_training_test_says_it_is_still_stepping(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[object] = []
    counter = pytest_steps.StepCounter(events.append, tmp_path)
    counter._registered = True  # no global hook in this process: the hook's body is called below
    clock = iter([100.0, 100.2, 100.4, 101.3, 101.5, 102.4])
    monkeypatch.setattr(pytest_steps.time, "time", lambda: next(clock))
    optimizer = torch.optim.SGD([torch.zeros(2, requires_grad=True)], lr=0.1)
    counter.pytest_runtest_logstart("tests/test_fit.py::test_long", ("tests/test_fit.py", 1, "test_long"))  # at 100.0
    for _ in range(5):  # steps at 100.2, 100.4, 101.3, 101.5, 102.4
        counter._count(optimizer, (), {})
    counter.pytest_runtest_logfinish("tests/test_fit.py::test_long", ("tests/test_fit.py", 1, "test_long"))
    stepping = [e for e in events if isinstance(e, SteppingEvent)]
    assert [(e.optimizer_steps, e.at) for e in stepping] == [(3, 101.3), (5, 102.4)]  # a second apart at most once
    [training] = [e for e in events if isinstance(e, TrainingEvent)]
    assert training.optimizer_steps == 5
