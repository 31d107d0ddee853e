"""What git says of the target's folder; None wherever git is missing or the folder is no repository."""

from __future__ import annotations

import subprocess
from pathlib import Path


def rev_parse(root: Path, *args: str) -> str | None:
    """`git -C ROOT rev-parse ARGS`, its one line of output."""
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out = done.stdout.strip()
    return out if done.returncode == 0 and out else None
