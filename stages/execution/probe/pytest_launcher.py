"""Run the target's test suite in this (child) process:
`python -P -m stages/execution/probe/pytest_launcher.py < PytestRequest (JSON on stdin)`.

The request (`stages/contract/messages.py: PytestRequest`) names the target root, the
pytest arguments, the channel the injected plugin hands its events back on, and optionally
a coverage data file with the files to measure. It comes on stdin, and the channel is moved
out of sight before pytest imports any of the target's code: no test finds a file to append
forged events to. The stack guard is installed first so an overrun or a self-inflicted death
leaves stacks.
"""

from __future__ import annotations

import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from ...common.channel import receive_request
from ...contract.messages import CoverageSpec, PytestRequest
from ...common import guard, reads, start_env
from ...contract.pytest_events import ReadsEvent


class CoverageWindow:
    """Coverage of the listed files while the tests run, not while they are collected.

    The question is whether any test runs the entrypoint's body, and a function's body
    only runs when it is called; tracing the imports of collection (torch's among them)
    would only add cost.
    """

    def __init__(self, spec: CoverageSpec) -> None:
        import coverage

        self._cov = coverage.Coverage(data_file=spec.data_file, include=list(spec.include), config_file=False, branch=False)
        self._started = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtestloop(self, session: pytest.Session) -> Generator[None, Any, Any]:
        self._cov.start()
        self._started = True
        try:
            return (yield)
        finally:
            self.save()

    def save(self) -> None:
        if self._started:
            self._started = False
            self._cov.stop()
            self._cov.save()


class UnusedHypothesisSummary:
    """Hypothesis's pytest plugin (installed with hypothesis, so loaded in every run where it
    is installed) imports hypothesis in its terminal summary, at the end of every run, whether
    or not a test used it: 0.6 to 0.8 s of CPU per run on a two-core machine (hypothesis
    6.170). Without that import it has nothing to report (statistics, observations and failing
    examples all come from hypothesis), so where no test imported hypothesis the plugin is
    unregistered before the summary: the run's output is the same, only sooner."""

    PLUGIN = "hypothesispytest"  # its entry point's name, under which pytest registers it

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Inside the terminal reporter's wrapper of this hook, which writes the summary after it.
        manager = session.config.pluginmanager
        plugin = manager.get_plugin(self.PLUGIN)
        if plugin is not None and "hypothesis" not in sys.modules:
            manager.unregister(plugin)


def main() -> None:
    guard.install()
    request, channel = receive_request(PytestRequest)
    root = Path(request.root).resolve()
    # Before pytest imports any of the target's code: what the run reads tells its inputs from its results.
    files_read = reads.install(str(root))
    start_env.hide_after_start(request.read_at_start)

    from .pytest_accounting import TestAccountant
    from .pytest_plugin import EventRecorder, install_warning_sites

    recorder = EventRecorder(channel, root)
    accountant = TestAccountant(recorder.emit, root)
    recorder.phase_facts = accountant.phase_facts
    install_warning_sites()
    from .pytest_steps import StepCounter

    plugins: list[Any] = [recorder, accountant, StepCounter(recorder.emit, root), UnusedHypothesisSummary()]
    if request.coverage is not None:
        plugins.append(CoverageWindow(request.coverage))
    # What `python -m pytest` in the target's root gives its tests: the root first on sys.path
    # (this process started without it, so that nothing there could shadow the gate's modules).
    sys.path.insert(0, str(root))
    try:
        code = int(pytest.main(list(request.args), plugins=plugins))
    finally:
        recorder.emit(ReadsEvent(reads=files_read()))
        recorder.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads or atexit hooks the tests left behind must not change an outcome already handed back.
    guard.exit_after_reporting(code)


if __name__ == "__main__":
    main()
