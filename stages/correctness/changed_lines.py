"""Where the change since the baseline touched the training code (docs/baseline-comparison.md):
the lines of the target's Python files that differ from the baseline report's commit, read with
`git diff` in the user's tree (its working tree against the commit, as the gate runs it).

A training-regression that no nearer fact locates (the loss stopped falling, modules stopped
changing) is located at a changed line the run executed (one of the lines the instruments
recorded: a loader's construction, a loss, a step), else at the first changed line of the
entrypoint's file, else at the entrypoint. Nothing is read where the report has no commit, the
gate has no checkout, or git cannot tell.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

from traingate.pipeline.model.schema import Location
from traingate.stages.base import location_of
from traingate.stages.contract.payloads.base import Site

_GIT_TIMEOUT_S = 20
# A commit id as the gate records it (`git rev-parse HEAD`): nothing git could read as an option.
_COMMIT = re.compile(r"[0-9a-f]{4,64}")
_HUNK = re.compile(r"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@")


def changed_lines(origin: Path | None, commit: str | None) -> dict[str, set[int]] | None:
    """path (relative to `origin`) -> the lines of this version that the change touched; None
    where git cannot tell."""
    if origin is None or not commit or not _COMMIT.fullmatch(commit):
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(origin), "diff", "-U0", "--no-color", "--no-ext-diff", "--no-textconv", "--relative", commit, "--", "*.py"],
            capture_output=True, text=True, timeout=_GIT_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_diff(done.stdout) if done.returncode == 0 else None


def parse_diff(text: str) -> dict[str, set[int]]:
    """The new side's touched lines of a `-U0` diff (a deletion touches the line after it)."""
    found: dict[str, set[int]] = {}
    path: str | None = None
    for line in text.splitlines():
        if line.startswith("+++ "):
            path = line[6:] if line.startswith("+++ b/") else None
        elif path is not None and (hunk := _HUNK.match(line)):
            start, count = int(hunk.group(1)), int(hunk.group(2) or 1)
            found.setdefault(path, set()).update(range(start, start + count) if count else {start + 1})
    return found


def nearest_changed(changed: dict[str, set[int]], sites: Iterable[Site], fallback: Location) -> Location | None:
    """A changed line the run executed, else the first changed line of the fallback's file."""
    executed = sorted((s for s in sites if s.line in changed.get(s.path, set())), key=lambda s: (s.path, s.line))
    if executed:
        return location_of(executed[0])
    lines = sorted(changed.get(fallback.path, set()))
    return Location(path=fallback.path, line=lines[0]) if lines else None
