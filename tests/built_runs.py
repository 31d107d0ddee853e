"""Gate runs of targets a test built (a fixture target with a route's edits): one per name for
the session, whichever xdist worker asks first (`gate_once`), read by every test that asks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.conftest import GateRun, gate_once


def built_run_once(shared: Path, name: str, make: Callable[[Path], GateRun]) -> GateRun:
    """make(out) once per session and name, in `shared` (`shared_folder`)."""
    return gate_once(shared, f"accounting-{name}", make)[0]
