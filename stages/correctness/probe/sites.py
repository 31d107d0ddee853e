"""Call sites in the target's code, interned so each is resolved once per run."""

from __future__ import annotations

import linecache
import os
import sys
from pathlib import Path
from types import FrameType
from typing import Any

from traingate.stages.contract.frames import is_target_file, relative


class SiteTable:
    """{path, line, function, code} of target frames; records refer to them by index."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.sites: list[dict[str, Any]] = []
        self._index: dict[tuple[str, int, str], int] = {}

    def intern(self, filename: str, line: int, function: str) -> int:
        key = (filename, line, function)
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.sites)
            code = linecache.getline(os.path.abspath(filename), line).strip()
            self.sites.append({"path": relative(filename, self.root), "line": line, "function": function, "code": code})
        return index

    def innermost(self, skip: int = 1) -> int | None:
        """Index of the innermost frame of the target above the caller (`skip` frames dropped)."""
        frame: FrameType | None = sys._getframe(skip + 1)
        while frame is not None:
            filename = frame.f_code.co_filename
            if is_target_file(filename, self.root):
                return self.intern(filename, frame.f_lineno, frame.f_code.co_name)
            frame = frame.f_back
        return None
