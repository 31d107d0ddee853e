"""A watched run's progress: how many optimizer steps it made and when the last one ended, in a
small file the stage reads only if the run overruns its budget. A run still stepping when its
budget ended is a budget overrun; one whose steps had stopped is a hang.

Written in every run but the unwatched one (the smoke call, which nothing observes): those runs
count as watched in the unwatched comparison. What the code under review writes into the file
can only turn one blocking finding into the other.
"""

from __future__ import annotations

import time
from typing import Any

from . import faults

# At most one write per this many seconds (and the first step's): the hook is on every step.
THROTTLE_S = 0.25


def install(path: str) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    state = {"steps": 0, "written": 0.0}

    @faults.guarded
    def after_step(optimizer: Any, args: Any, kwargs: Any) -> None:
        state["steps"] += 1
        now = time.time()
        if state["steps"] > 1 and now - state["written"] < THROTTLE_S:
            return
        state["written"] = now
        try:
            with open(path, "w", encoding="ascii") as out:
                out.write(f"{state['steps']} {now:.3f}\n")
        except OSError:
            pass  # no progress to read: a stop at the budget reads as a hang, which blocks as well

    register_optimizer_step_post_hook(after_step)
