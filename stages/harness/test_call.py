"""Run one test of the target's suite as the entrypoint: pytest in the harness's own process.

With no entrypoint configured, the stages that observe training run the test that trained in
the execution stage's run (`EntrypointRequest.test`). The instruments are installed before
pytest imports the test's module, exactly as before a configured entrypoint's import, so every
check applies to the training the test runs. The test's outcome is the call's: a test that
fails raises its own exception here (its frames locate it), and one that pytest did not run
and pass (not found, skipped, an error in a fixture) raises `TestNotRun`.
"""

from __future__ import annotations

from collections.abc import Generator

import pytest


class TestNotRun(Exception):
    """The observed test did not run to a pass, and no exception of its own says why."""

    __test__ = False  # not a pytest test class


class _Outcome:
    """What pytest did with the one test: each phase's outcome and the first exception raised."""

    def __init__(self, nodeid: str) -> None:
        self.nodeid = nodeid
        self.phases: dict[str, str] = {}
        self.raised: BaseException | None = None
        self.skip_reason = ""

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        self.phases[report.when] = report.outcome
        if report.failed and call.excinfo is not None and self.raised is None:
            self.raised = call.excinfo.value
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            self.skip_reason = str(report.longrepr[2])
        return report


def run_test(nodeid: str, args: list[str]) -> None:
    """Run pytest with `args` (the node id first); return when the test passed, raise otherwise."""
    outcome = _Outcome(nodeid)
    code = pytest.main(list(args), plugins=[outcome])
    if outcome.raised is not None:
        raise outcome.raised
    if outcome.phases.get("call") == "passed" and all(o == "passed" for o in outcome.phases.values()):
        return
    raise TestNotRun(_why_not(nodeid, outcome, int(code)))


def _why_not(nodeid: str, outcome: _Outcome, code: int) -> str:
    if not outcome.phases:
        return f"pytest did not run {nodeid} (exit status {code}): the test is not collected here"
    if "skipped" in outcome.phases.values():
        return f"{nodeid} was skipped: {outcome.skip_reason or 'no reason given'}"
    return f"{nodeid} did not pass: " + ", ".join(f"{when} {what}" for when, what in outcome.phases.items())
