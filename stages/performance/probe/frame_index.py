"""Fast frame classification for the performance instruments.

The instruments look at the Python stack on hot paths (a new tensor storage, a sync, a sample
of the main thread), so `is_target_file` is cached per code object, and frames of torch's
own dunder plumbing (`Tensor.__format__` calling `.item()`, `_tensor_str` printing a tensor)
are "transparent": a sync they make is charged to the code that called them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

from ...common.frames import is_target_file, relative, site_fields

Site = tuple[str, int, str]  # (path relative to the target root, line, function)

_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))


def _torch_plumbing_files() -> set[str]:
    """Files whose frames only forward a call (dunder methods, printing, dispatch modes).
    Resolved from torch's folder, not imported: importing torch._dynamo costs seconds."""
    import torch

    base = os.path.dirname(os.path.abspath(torch.__file__))
    names = [
        "_tensor.py", "_tensor_str.py", "overrides.py", "utils/_python_dispatch.py", "_ops.py",
        # Dispatch modes are entered through torch.compile's "disable" wrappers.
        "_compile.py", "_dynamo/eval_frame.py",
    ]
    return {os.path.join(base, *name.split("/")) for name in names}


class FrameIndex:
    """Answers "is this frame the target's?" once per code object."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._target: dict[CodeType, bool] = {}
        self._transparent: dict[CodeType, bool] = {}
        self._paths: dict[CodeType, str] = {}  # relative path per code object: on every new storage
        # The site of each call instruction seen: a frame's line number is found by walking its
        # code's line table (microseconds near the end of a long training function), and the
        # same few call sites make every operator of a loop.
        self._sites: dict[tuple[CodeType, int], Site] = {}
        self._plumbing = _torch_plumbing_files()

    def is_target(self, code: CodeType) -> bool:
        known = self._target.get(code)
        if known is None:
            known = self._target[code] = is_target_file(code.co_filename, self.root)
        return known

    def is_target_path(self, path: str) -> bool:
        return is_target_file(path, self.root)

    def is_transparent(self, code: CodeType) -> bool:
        known = self._transparent.get(code)
        if known is None:
            path = os.path.abspath(code.co_filename)
            known = self._transparent[code] = path.startswith(_RUNTIME_DIR) or path in self._plumbing
        return known

    def site(self, frame: FrameType) -> Site:
        code = frame.f_code
        key = (code, frame.f_lasti)
        found = self._sites.get(key)
        if found is None:
            path = self._paths.get(code)
            if path is None:
                path = self._paths[code] = relative(code.co_filename, self.root)
            found = self._sites[key] = (path, frame.f_lineno, code.co_name)
        return found

    def innermost(self, frame: FrameType | None) -> Site | None:
        """The innermost target frame at or above `frame`."""
        while frame is not None:
            if self.is_target(frame.f_code):
                return self.site(frame)
            frame = frame.f_back
        return None

    def caller(self, frame: FrameType | None) -> tuple[Site | None, bool, str]:
        """Who made a call: (innermost target site, whether the target made it directly,
        the library function that made it otherwise). `frame` is the first frame above the
        instrument's own wrapper."""
        while frame is not None and self.is_transparent(frame.f_code):
            frame = frame.f_back
        if frame is None:
            return None, False, ""
        if self.is_target(frame.f_code):
            return self.site(frame), True, ""
        module = frame.f_globals.get("__name__", "?")
        via = f"{module}.{frame.f_code.co_qualname}" if hasattr(frame.f_code, "co_qualname") else f"{module}.{frame.f_code.co_name}"
        return self.innermost(frame.f_back), False, via


def caller_frame(depth: int = 2) -> FrameType | None:
    try:
        return sys._getframe(depth)
    except ValueError:
        return None


def site_with_code(site: Site | None, root: Path) -> dict[str, Any] | None:
    """The site as a `payloads.base.Site` record, with the source line's text."""
    if site is None:
        return None
    path, line, function = site
    return site_fields(str(root / path), line, function, root)


# Nodes one graph walk visits at most. It bounds the walk's cost on very large graphs, and
# more: every node reached through `next_functions` gets a Python wrapper, and a long chain
# of wrapped nodes is later freed recursively: a 50,000-node chain walked whole crashes the
# process (stack overflow) when the graph is released.
MAX_WALK_NODES = 10_000


def graph_size(tensor: Any, limit: int = MAX_WALK_NODES) -> int:
    """Autograd nodes reachable from `tensor.grad_fn`, counted up to `limit`."""
    return graphs_size([tensor], limit)


def graphs_size(tensors: list[Any], limit: int = MAX_WALK_NODES) -> int:
    """Autograd nodes reachable from any of `tensors`' grad_fn (shared nodes once), counted
    up to `limit` and never past MAX_WALK_NODES: a count equal to it means "at least"."""
    limit = min(limit, MAX_WALK_NODES)
    seen: set[int] = set()
    todo = [getattr(t, "grad_fn", None) for t in tensors]
    while todo and len(seen) < limit:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        todo.extend(n for n, _ in getattr(node, "next_functions", ()))
    return len(seen)
