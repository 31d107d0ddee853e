"""What the process holds in host memory at a step boundary, whatever holds it.

The tensor-storage registry (tracker.py) sees tensor bytes only. An autograd graph kept
alive across steps (`running_loss += loss`) holds its nodes in host memory after backward
has freed the tensors they saved: on a 10,400-node chain about 6 MB a step that no tensor
byte count shows. So the memory the C heap has handed out is measured as well:

- glibc's `mallinfo2()`: bytes in use in every arena (`uordblks`) plus the chunks served
  by mmap (`hblkhd`). Freed memory leaves it at once (unlike the resident size, which keeps
  the allocator's free lists), so a clean loop's series is flat to a few KiB. It walks the
  free lists: 5 us on a small heap, about 5 ms on a heap of leaked graph nodes;
- elsewhere (musl, macOS) the resident set size from `/proc/self/statm`, coarser: it keeps
  the high-water mark of the allocator's pages.
Python objects under 512 bytes live in pymalloc's own arenas, outside mallinfo2's count but
inside the resident size; a loop that keeps that many small objects is not what this
measure is for.
"""

from __future__ import annotations

import ctypes
import os

HEAP = "host heap in use (glibc mallinfo2)"
RESIDENT = "process resident memory (/proc/self/statm)"


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


class HostMemory:
    """Reads the process's host memory in use; `source` says which measure (None: none)."""

    def __init__(self) -> None:
        self._mallinfo2 = _mallinfo2()
        self.source: str | None = HEAP if self._mallinfo2 is not None else (RESIDENT if os.path.exists("/proc/self/statm") else None)
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

    def read(self) -> int | None:
        if self._mallinfo2 is not None:
            info = self._mallinfo2()
            return int(info.uordblks + info.hblkhd)
        if self.source == RESIDENT:
            try:
                with open("/proc/self/statm", encoding="ascii") as statm:
                    return int(statm.read().split()[1]) * self._page
            except (OSError, ValueError, IndexError):
                return None
        return None


def _mallinfo2() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """glibc's mallinfo2 (2.33 and later), or None."""
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function
