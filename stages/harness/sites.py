"""Call sites in the target's code, interned so each is resolved once per run.

The concurrency and correctness probes record one event per optimizer step, GradScaler,
DataLoader or loss call; each event refers to its line of the target by an index into the
probe's own table (`sites`, a list of `payloads.base.Site` records).
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType
from typing import Any

from ..common.frames import is_target_file, site_fields


class SiteTable:
    """Interns {path, line, function, code} of target frames; events refer to them by index."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sites: list[dict[str, Any]] = []
        self._index: dict[tuple[str, int, str], int] = {}

    def is_target(self, filename: str) -> bool:
        return is_target_file(filename, self.root)

    def intern(self, filename: str, line: int, function: str) -> int:
        key = (filename, line, function)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.sites)
            self.sites.append(site_fields(filename, line, function, self.root))
        return index

    def innermost(self, skip: int = 1) -> int | None:
        """Index of the innermost target frame above the caller (`skip` frames dropped)."""
        frame: FrameType | None = sys._getframe(skip + 1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if self.is_target(filename):
                return self.intern(filename, frame.f_lineno, frame.f_code.co_name)
            frame = frame.f_back
        return None

    def direct_caller(self, skip: int = 1) -> int | None:
        """Index of the calling frame when it is the target's own code, else None.

        Used where only a call the target itself makes counts (a seed it sets), not one that
        torch makes on its behalf further down.
        """
        frame = sys._getframe(skip + 1)
        filename = frame.f_code.co_filename
        if self.is_target(filename):
            return self.intern(filename, frame.f_lineno, frame.f_code.co_name)
        return None

    def site(self, index: int | None) -> dict[str, Any] | None:
        return None if index is None else self.sites[index]

    def definition(self, obj: Any) -> dict[str, Any] | None:
        """Where a function (a lambda, a closure) of the target was defined."""
        code = getattr(obj, "__code__", None)
        if code is None or not self.is_target(code.co_filename):
            return None
        return self.site(self.intern(code.co_filename, code.co_firstlineno, code.co_name))
