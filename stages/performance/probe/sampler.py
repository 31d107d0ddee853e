"""Where the part of a step that is neither data, forward, backward nor optimizer goes.

A daemon thread reads the main thread's frame every few milliseconds
(`sys._current_frames()`), asks the step clock which phase is active, and charges samples
taken outside the four phases (and inside the data wait, for loaders without workers) to the
innermost frame of the target's code. A metrics tracker that shells out to `nvidia-smi`
every epoch shows up as its `subprocess.run` line. Sampling costs one GIL hand-over per
interval; it runs only in the instrumented run, never in the timing runs.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from .clock import INSTRUMENT, StepClock
from .frame_index import FrameIndex, Site

INTERVAL_S = 0.002


class Sampler:
    def __init__(self, frames: FrameIndex, clock: StepClock, interval_s: float = INTERVAL_S) -> None:
        self.frames = frames
        self.clock = clock
        self.interval_s = interval_s
        self.counts: dict[tuple[str, Site | None, int], int] = {}
        self.taken = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def _run(self) -> None:
        main = self.clock.main_thread
        while not self._stop.wait(self.interval_s):
            phase = self.clock.phase()
            if phase in ("before", INSTRUMENT, "forward", "backward", "optimizer"):
                continue
            frame = sys._current_frames().get(main)
            site = self.frames.innermost(frame)
            # Held until the next sample, the frame (and the frames above it) would keep the
            # loop's tensors of that moment alive: memory the tracker would count as held.
            frame = None
            key = (phase or "rest", site, self.clock.completed)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.taken += 1

    def collect(self, steps: int) -> dict[str, Any]:
        """Samples taken inside the training steps, per phase and target line."""
        merged: dict[tuple[str, Site | None], int] = {}
        for (phase, site, step), n in list(self.counts.items()):
            if step < steps:
                merged[(phase, site)] = merged.get((phase, site), 0) + n
        rows = sorted(merged.items(), key=lambda kv: -kv[1])[:30]
        return {
            "interval_s": self.interval_s,
            "samples": [{"phase": p, "site": list(s) if s else None, "count": n} for (p, s), n in rows],
        }
