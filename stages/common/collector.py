"""The collector around the imports of a process that others are forked from (a warm
interpreter, the import server, the gate server)."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No garbage collection while the imports run, and what they made set aside after: the
    collections an import of torch triggers walk its ever-growing heap again and again (a
    sixth of its CPU), and in every fork a collection would walk, and copy page by page,
    objects that are never freed (a gate server's forks: 33 ms a run). The forks collect what
    they make, with the collector on (the pattern `gc.freeze` documents for a process that
    forks without exec)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()
