"""Helpers of the correctness stage's end-to-end tests: the arguments of the session's one
`traingate run --stages correctness` per fixture target (`shared_gate`), and where its
findings and checks point."""

from __future__ import annotations

from typing import Any

from collections.abc import Callable

from tests.conftest import TARGETS, GateRun, line_of

CORRECTNESS = ("--stages", "correctness")
Shared = Callable[..., tuple[GateRun, float]]


def marker(case: str, name: str) -> tuple[str, int]:
    """train.py and the line of its `# marker: NAME` comment."""
    return "train.py", line_of(TARGETS / case / "train.py", f"# marker: {name}")


def located(finding: dict[str, Any]) -> tuple[str, int]:
    return finding["location"]["path"], finding["location"]["line"]


def site(record: dict[str, Any]) -> tuple[str, int]:
    return record["path"], record["line"]


def checks(run: GateRun) -> dict[str, Any]:
    found: dict[str, Any] = run.stage("correctness")["details"]["checks"]
    return found
