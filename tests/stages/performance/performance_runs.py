"""The performance stage's runs of the fixture targets, as its tests read them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.conftest import GateRun


# The performance stage alone: a fixture target's run is the session's (`shared_gate`), which
# test_verdicts and others read too; a target a test builds gets a run of its own.
PERFORMANCE = ("--stages", "performance")
Shared = Callable[..., tuple[GateRun, float]]


def only(run: GateRun, category: str) -> dict[str, Any]:
    found = run.findings(category)
    assert len(found) == 1, [f["title"] for f in run.findings()]
    return found[0]


def metric(run: GateRun, prefix: str) -> dict[str, Any]:
    return next(m for m in run.stage("performance")["metrics"] if m["name"].startswith(prefix))
