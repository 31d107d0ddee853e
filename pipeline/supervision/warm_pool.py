"""The warm interpreters of one stage (`traingate.pipeline.supervision.warm`): one per
environment and folder its runs ask for, started at the first such run and registered with
what this process owns (`spawned`), all stopped at the stage's end."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from traingate.pipeline.supervision import spawned
from traingate.pipeline.supervision.disguise import Disguise
from traingate.pipeline.supervision.warm import AgentHost, NotServed, WarmInterpreter
from traingate.stages.common.inherited import InheritedWarm


class WarmPool:
    """The warm interpreters (`traingate.pipeline.supervision.warm`) of one stage: one per environment and
    folder its runs ask for, started at the first such run, all stopped by `close`. They run the
    run's copy of the child side (`disguise`: `pipeline/supervision/disguise.py`) when one is given."""

    def __init__(self, scratch: Path, *, handed_down: InheritedWarm | None = None, disguise: Disguise | None = None, preload: tuple[str, ...] = ()) -> None:
        self.scratch = scratch
        self.disguise = disguise
        # What the interpreters it starts import besides torch (`warm.TEST_RUN_IMPORTS`).
        self.preload = preload
        self._started: list[WarmInterpreter] = []
        self._lock = threading.Lock()  # the execution stage asks from two threads at once
        # Whether an interpreter was handed down (torch imported already): a run forked from it
        # costs no import, whatever the run imports itself.
        self.handed_down = handed_down is not None
        if handed_down is not None:
            with spawned.LOCK:
                self._add(WarmInterpreter.adopt(handed_down, disguise))

    def host_agents(self, target_env: dict[str, str], agent_env: dict[str, str], cwd: Path, *, served_only: bool = False) -> bool:
        """Start the gate run's `AgentHost` now, so its imports overlap the work before the
        first stage (stage agents launched with this pool are forks of it); whether it started
        (`served_only`: only as a fork of the import server, `warm.AgentHost`)."""
        with self._lock, spawned.LOCK:
            try:
                host = AgentHost(target_env, agent_env, cwd, self.scratch, tag=_warm_tag(), mask=self.disguise, preload=self.preload, served_only=served_only)
            except NotServed:
                with contextlib.suppress(OSError):
                    self.scratch.rmdir()  # only when empty: nothing was started there
                return False
            self._add(host)
        return True

    def _add(self, warm: WarmInterpreter) -> None:
        spawned.WARM[warm.pid] = warm
        self._started.append(warm)

    def ready_for(self, env: dict[str, str], cwd: Path, timeout_s: float) -> WarmInterpreter | None:
        """The interpreter for this environment and folder (started now if there is none yet),
        once its imports are done; None when they failed, warned or did not finish within
        `timeout_s` (the run starts a fresh interpreter; so does one that finds it busy)."""
        warm = self._for(env, cwd)
        return warm if warm.wait_ready(timeout_s) else None

    def start_early(self, env: dict[str, str], cwd: Path) -> None:
        """Start the interpreter for runs with this environment and folder now, unless there is
        one, and return without waiting: its imports overlap the stage's work until its first
        run (`env` as `run_child` gives it to the run, `isolation.child_environment`)."""
        self._for(env, cwd)

    def _for(self, env: dict[str, str], cwd: Path) -> WarmInterpreter:
        with self._lock:
            warm = next((w for w in self._started if w.accepts(env, cwd)), None)
            if warm is None:
                with spawned.LOCK:
                    warm = WarmInterpreter.start(env, cwd, self.scratch, tag=_warm_tag(), mask=self.disguise, preload=self.preload)
                    self._add(warm)
            return warm

    def interpreters(self) -> list[WarmInterpreter]:
        with self._lock:
            return list(self._started)

    def close(self) -> None:
        with self._lock:
            started, self._started = self._started, []
        for warm in started:
            warm.close()
            with spawned.LOCK:
                spawned.WARM.pop(warm.pid, None)


def _warm_tag() -> str:
    return f"{os.getpid()}:warm:{next(spawned.RUN_NUMBERS)}"
