"""Run one test of the target's suite as the entrypoint: pytest in the harness's own process.

With no entrypoint configured, the stages that observe training run the test that trained in
the execution stage's run (`EntrypointRequest.test`). The instruments are installed before
pytest imports the test's module, exactly as before a configured entrypoint's import, so every
check applies to the training the test runs. The test's outcome is the call's: a test that
fails raises its own exception here (its frames locate it), and one that pytest did not run
and pass (not found, skipped, an error in a fixture) raises `TestNotRun`.

Once the test has run its setup, call and teardown (session fixtures torn down with it), its
outcome is handed to `test_done`, which hands the run's result back and ends the process:
pytest's end of session (its summary, its plugins' hooks, and the unconfigure that collects
the garbage of a process holding all of torch, several times) is the cost of a pytest run,
not of the training, and decides nothing here.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import NoReturn

import pytest

# Takes the test's outcome (None: it passed; else what it raised) and ends the process.
TestDone = Callable[[BaseException | None], NoReturn]


class TestNotRun(Exception):
    """The observed test did not run to a pass, and no exception of its own says why."""

    __test__ = False  # not a pytest test class


class _Outcome:
    """What pytest did with the one test: each phase's outcome and the first exception raised."""

    def __init__(self, nodeid: str, test_done: TestDone | None) -> None:
        self.nodeid = nodeid
        self.phases: dict[str, str] = {}
        self.raised: BaseException | None = None
        self.skip_reason = ""
        self._test_done = test_done

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        self.phases[report.when] = report.outcome
        if report.failed and call.excinfo is not None and self.raised is None:
            self.raised = call.excinfo.value
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            self.skip_reason = str(report.longrepr[2])
        return report

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, object, object]:
        ran = yield
        if self._test_done is not None and "teardown" in self.phases:
            self._test_done(self.error(None))
        return ran

    def error(self, code: int | None) -> BaseException | None:
        """None when the test passed; else what it raised, or why it did not run to a pass."""
        if self.raised is not None:
            return self.raised
        if self.phases.get("call") == "passed" and all(o == "passed" for o in self.phases.values()):
            return None
        return TestNotRun(_why_not(self.nodeid, self, code))


def run_test(nodeid: str, args: list[str], test_done: TestDone | None = None) -> None:
    """Run pytest with `args` (the node id first); return when the test passed, raise otherwise.
    With `test_done`, the outcome goes there once the test has run, and this never returns."""
    outcome = _Outcome(nodeid, test_done)
    code = pytest.main(list(args), plugins=[outcome])
    error = outcome.error(int(code))
    if error is not None:
        raise error


def _why_not(nodeid: str, outcome: _Outcome, code: int | None) -> str:
    if not outcome.phases:
        return f"pytest did not run {nodeid} (exit status {code}): the test is not collected here"
    if "skipped" in outcome.phases.values():
        return f"{nodeid} was skipped: {outcome.skip_reason or 'no reason given'}"
    return f"{nodeid} did not pass: " + ", ".join(f"{when} {what}" for when, what in outcome.phases.items())
