"""Which frames belong to the target: locations point at the target's code (docs/contract.md, rule 5.4)."""

from __future__ import annotations

import linecache
import os
from functools import lru_cache
from pathlib import Path
from collections.abc import Iterable
from typing import Any

_FOREIGN_PARTS = {"site-packages", "dist-packages", ".venv", "venv", ".tox", ".nox"}


@lru_cache(maxsize=8192)
def is_target_file(filename: str, root: Path) -> bool:
    """Cached: instruments ask on hot paths (every sync, storage or scaler call). A file outside
    `root` is told by its path's text first: a probe asks about every loaded module's file at
    its end (torch's two thousand), where building a path object each cost 40 ms a run."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    base = str(root)
    if path != base and not path.startswith(base if base.endswith(os.sep) else base + os.sep):
        return False
    try:
        rel = Path(path).relative_to(root)
    except ValueError:  # still possible: POSIX keeps a leading "//" that Path reads as a root of its own
        return False
    return not (_FOREIGN_PARTS & set(rel.parts))


def relative(filename: str, root: Path) -> str:
    return Path(os.path.abspath(filename)).relative_to(root).as_posix()


def site_fields(filename: str, line: int, function: str, root: Path) -> dict[str, Any]:
    """A line of the target as the payloads carry it (`payloads.base.Site`): its path relative
    to the target root, the line, the function and the line's source text."""
    return {"path": relative(filename, root), "line": line, "function": function, "code": linecache.getline(os.path.abspath(filename), line).strip()}


def innermost_target(frames: Iterable[tuple[str, int, str]], root: Path, innermost_first: bool) -> dict[str, Any] | None:
    """`site_fields` of the innermost frame in the target's code."""
    ordered = list(frames) if innermost_first else list(frames)[::-1]
    for filename, line, function in ordered:
        if is_target_file(filename, root):
            return site_fields(filename, line, function, root)
    return None
