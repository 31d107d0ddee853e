"""A fixture repo's training observed through its tests (no entrypoint configured) against the
same repo with a hand-written entrypoint that makes its test's call: the shared reading of
tests/e2e/test_observed_tests.py and tests/e2e/test_framework_loops.py.

A case is (stages, the hand-written entrypoint, the observed test, expected findings as
(category, file, marker)).
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import TARGETS, GateRun, line_of, run_gate

OBSERVING = ("performance", "concurrency", "correctness")

Case = tuple[str, str, str, list[tuple[str, str, str]]]


def observed_or_configured(cases: dict[str, Case], shared_gate: Callable[..., tuple[GateRun, float]], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], GateRun]:
    """runs(case, configured): the session's run of the fixture as it is (no entrypoint), or
    the run of a copy with the hand-written entrypoint, each made once."""
    done: dict[str, GateRun] = {}

    def run(case: str, configured: bool) -> GateRun:
        stages, entrypoint, _, _ = cases[case]
        if not configured:
            return shared_gate(case, "--stages", stages)[0]
        if case not in done:
            base = tmp_path_factory.mktemp(f"{case}-configured")
            target = base / "repo"
            shutil.copytree(TARGETS / case, target)
            with (target / "pyproject.toml").open("a") as toml:
                toml.write(f"\n[tool.traingate.entrypoint]\n{entrypoint}\n")
            done[case] = run_gate(target, base / "out", "--stages", stages)
        return done[case]

    return run


def observed_findings(run: GateRun) -> list[dict[str, Any]]:
    return [f for s in run.report["stages"] if s["name"] in OBSERVING for f in s["findings"]]


def places(run: GateRun) -> set[tuple[str, str | None, int | None]]:
    return {(f["category"], (f["location"] or {}).get("path"), (f["location"] or {}).get("line")) for f in observed_findings(run)}


def assert_same_verdict(observed: GateRun, configured: GateRun, stages: str) -> None:
    """Same decision and findings (category, path, line) both ways; every stage asked for ran."""
    assert observed.report["decision"] == configured.report["decision"], (observed.stdout, configured.stdout)
    assert places(observed) == places(configured), (observed.stdout, configured.stdout)
    assert [s["name"] for s in observed.report["stages"]] == stages.split(",")
    assert all(s["status"] != "skipped" for s in observed.report["stages"]), observed.stdout


def assert_found_at_markers(run: GateRun, case: str, test: str, expected: list[tuple[str, str, str]]) -> None:
    """Each expected finding blocks at its marker's line and names the observed test; no other."""
    assert run.report["observed_training"]["test"] == test, run.stdout
    for category, path, marker in expected:
        found = [f for f in observed_findings(run) if f["category"] == category]
        assert found, (case, category, run.stdout)
        assert (found[0]["location"]["path"], found[0]["location"]["line"]) == (path, line_of(TARGETS / case / path, marker))
        assert found[0]["blocking"]
    assert all(f["evidence"]["data"]["training_test"] == test for f in observed_findings(run))
    assert {c for c, _, _ in places(run)} == {c for c, _, _ in expected}, run.stdout
    assert run.report["decision"] == ("BLOCK" if expected else "PASS")
