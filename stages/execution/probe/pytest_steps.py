"""Counts the optimizer steps each test makes in the suite's run: with no entrypoint
configured, the tests that step an optimizer are the training runs the later stages observe.

A global post-hook of `torch.optim.Optimizer.step` (every optimizer built on that class, the
target's own included) adds one per step. It is registered once torch's optimizers are
imported, checked as each test starts: a suite that never imports torch never pays for it,
and the test modules, imported at collection, have imported torch by then. A test that makes
its first import of torch inside its own body is counted from the next test on.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from ...contract.pytest_events import PytestEvent, TrainingEvent


class StepCounter:
    """A pytest plugin: one `training` event per test that made optimizer steps."""

    def __init__(self, emit: Callable[[PytestEvent], None]) -> None:
        self._emit = emit
        self._registered = False
        self._steps = 0

    def _count(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._steps += 1

    def _register(self) -> None:
        optim = sys.modules.get("torch.optim.optimizer")
        if self._registered or optim is None:
            return
        register = getattr(optim, "register_optimizer_step_post_hook", None)
        if register is not None:
            register(self._count)
            self._registered = True

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self._register()
        self._steps = 0

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        if self._steps:
            self._emit(TrainingEvent(nodeid=nodeid, optimizer_steps=self._steps))
        self._steps = 0
