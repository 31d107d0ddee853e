"""What this process started and still owns: the children running now and its warm
interpreters. A scan for leftovers (`isolation._kill_leftovers`) reads it, so that it never
takes a run of its own or a warm interpreter for a process a target left behind."""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traingate.pipeline.supervision.warm import WarmInterpreter

# Held while a child starts and is registered, and while leftovers are scanned.
LOCK = threading.Lock()
RUNNING: dict[int, str] = {}  # pid -> run tag of each child running now
RUN_NUMBERS = itertools.count(1)
# Warm interpreters this process started (pid -> interpreter): never another run's leftover.
WARM: dict[int, WarmInterpreter] = {}
