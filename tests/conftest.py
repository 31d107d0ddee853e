"""Shared fixtures: run traingate on a fixture target and read what it wrote."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from traingate.pipeline.processes import become_subreaper, kill_descendants

REPO = Path(__file__).resolve().parent.parent
TARGETS = Path(__file__).resolve().parent / "targets"
# The installed console script, as users and CI run it (never this checkout's folders on sys.path).
TRAINGATE = [str(Path(sys.executable).with_name("traingate"))]


@dataclass
class GateRun:
    returncode: int
    report: dict[str, Any]
    out: Path
    stdout: str
    stderr: str

    def findings(self, category: str | None = None, stage: str | None = None) -> list[dict[str, Any]]:
        return [
            f
            for s in self.report["stages"]
            for f in s["findings"]
            if (category is None or f["category"] == category) and (stage is None or f["stage"] == stage)
        ]

    def categories(self, stage: str | None = None) -> set[str]:
        return {f["category"] for f in self.findings(stage=stage)}

    def stage(self, name: str) -> dict[str, Any]:
        return next(s for s in self.report["stages"] if s["name"] == name)


def line_of(path: Path, text: str) -> int:
    """1-based number of the one line of `path` that holds `text` (expected lines are found,
    never hard-coded, so fixtures can change without silently moving what a test checks)."""
    lines = path.read_text().splitlines()
    [number] = [i for i, line in enumerate(lines, start=1) if text in line]
    return number


def run_gate(target: Path, out: Path, *args: str, timeout: float = 600) -> GateRun:
    """Run `traingate run` exactly as a CI job would, in a subprocess."""
    # When this suite itself runs in GitHub Actions, the runs it makes must not annotate the
    # real job or append to its step summary.
    env = {k: v for k, v in os.environ.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "TRAINGATE_POLICY")}
    done = subprocess.run(
        [*TRAINGATE, "run", str(target), "--out", str(out), *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env,
    )
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    return GateRun(done.returncode, report, out, done.stdout, done.stderr)


@pytest.fixture
def gate(tmp_path: Path):
    """gate("case_name", "--stages", "execution") runs traingate on tests/targets/case_name."""

    def _run(case: str | Path, *args: str, timeout: float = 600) -> GateRun:
        target = case if isinstance(case, Path) else TARGETS / case
        return run_gate(target, tmp_path / "out", *args, timeout=timeout)

    return _run


def pytest_sessionstart(session: pytest.Session) -> None:
    # Whatever a test starts, however it detaches (setsid, double fork), stays a descendant of
    # this process, so the check below sees it instead of init adopting it.
    become_subreaper()


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test ends with no process of its own still running: the gate kills what the
    target starts, and the tests kill what they start. One /proc scan when nothing is left."""
    yield
    left = [p for p in kill_descendants() if p.alive]
    if left:
        listing = "; ".join(f"pid {p.pid} (sid {p.sid}) {p.cmdline[:120]}" for p in left)
        pytest.fail(f"{len(left)} process(es) left running after the test (now killed): {listing}")
