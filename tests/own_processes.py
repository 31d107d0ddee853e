"""What a test itself started and left running, the worker's import server aside."""

from __future__ import annotations

import os

from traingate.pipeline.supervision.processes import KEPT, ProcessInfo, descendants


def alive_below_this_process() -> list[ProcessInfo]:
    """Every live descendant of this process, but the ones it keeps for its whole life (the
    worker's import server, `processes.KEPT`) and what runs below them."""
    return [p for p in descendants(os.getpid(), skip=lambda p: p.pid in KEPT) if p.alive]
