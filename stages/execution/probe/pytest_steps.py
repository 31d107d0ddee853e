"""Counts the optimizer steps each test makes in the suite's run, and where it made them: with
no entrypoint configured, the tests that step an optimizer are the training runs the later
stages observe, and a test that steps at a place no other observed test reached is a training
loop of its own.

A global post-hook of `torch.optim.Optimizer.step` (every optimizer built on that class, the
target's own included) adds one per step. It is registered once torch's optimizers are
imported, checked as each test starts: a suite that never imports torch never pays for it,
and the test modules, imported at collection, have imported torch by then. A test that makes
its first import of torch inside its own body is counted from the next test on.

The step's site is the innermost frame of the target's own code on the stack when the hook
runs (the line that called `.step()` in a hand-written loop, or the test's line that called a
framework's fit, whose loop is not the target's code) with the shapes of the parameters the
optimizer steps, in short: one Trainer's loop that fits two different models is two sites, two
tests that fit the same model in the same loop are one.
"""

from __future__ import annotations

import hashlib
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...common.frames import is_target_file, relative
from ...contract.pytest_events import MAX_STEP_SITES, PytestEvent, SteppingEvent, TrainingEvent

# A long training test tells the suite's parent it is still stepping at most this often.
STEPPING_EVERY_S = 1.0


class StepCounter:
    """A pytest plugin: one `training` event per test that made optimizer steps."""

    def __init__(self, emit: Callable[[PytestEvent], None], root: Path) -> None:
        self._emit = emit
        self._root = root
        self._registered = False
        self._steps = 0
        self._sites: Counter[str] = Counter()
        self._shapes: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        self._nodeid: str | None = None  # the test running now
        self._told = 0.0  # when its last `stepping` event was sent

    def _count(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._steps += 1
        now = time.time()
        # From the main thread only, as every other event: a record is never interleaved with one.
        if self._nodeid is not None and now - self._told >= STEPPING_EVERY_S and threading.current_thread() is threading.main_thread():
            self._told = now
            self._emit(SteppingEvent(nodeid=self._nodeid, optimizer_steps=self._steps, at=now))
        site = self._site(sys._getframe(1))
        if site is not None:
            self._sites[f"{site} (parameters {self._parameters(optimizer)})"] += 1

    def _parameters(self, optimizer: Any) -> str:
        """A short digest of the shapes of the parameters `optimizer` steps (computed once an
        optimizer; held weakly: the model is not kept alive past its test)."""
        try:
            return self._shapes[optimizer]
        except (KeyError, TypeError):
            pass
        try:
            shapes = [tuple(p.shape) for group in optimizer.param_groups for p in group["params"]]
        except (AttributeError, KeyError, TypeError):
            shapes = []
        digest = hashlib.sha256(repr(shapes).encode()).hexdigest()[:8]
        try:
            self._shapes[optimizer] = digest
        except TypeError:
            pass  # not weakly referable: computed again at its next step
        return digest

    def _site(self, frame: Any) -> str | None:
        """`path:line` of the innermost frame in the target's code; None when none is."""
        while frame is not None:
            filename = frame.f_code.co_filename
            if is_target_file(filename, self._root):
                return f"{relative(filename, self._root)}:{frame.f_lineno}"
            frame = frame.f_back
        return None

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
        self._sites.clear()
        self._nodeid, self._told = nodeid, time.time()

    def pytest_runtest_logfinish(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        if self._steps:
            # The sites it stepped at most first (then by name: the same run, the same list).
            sites = sorted(self._sites, key=lambda s: (-self._sites[s], s))[:MAX_STEP_SITES]
            self._emit(TrainingEvent(nodeid=nodeid, optimizer_steps=self._steps, sites=sites))
        self._steps = 0
        self._sites.clear()
        self._nodeid = None
