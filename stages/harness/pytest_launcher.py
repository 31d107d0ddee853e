"""Run the target's test suite in this (child) process: `python -P -m traingate.stages.harness.pytest_launcher REQUEST_JSON`.

The request names the target root, the pytest arguments, the events file the injected
plugin writes, and optionally a coverage data file with the files to measure. The stack
guard is installed first so an overrun or a self-inflicted death leaves stacks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Generator

import pytest

from traingate.stages.harness import guard


class CoverageWindow:
    """Coverage of the listed files while the tests run, not while they are collected.

    The question is whether any test runs the entrypoint's body, and a function's body
    only runs when it is called; tracing the imports of collection (torch's among them)
    would only add cost.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        import coverage

        self._cov = coverage.Coverage(data_file=spec["data_file"], include=spec["include"], config_file=False, branch=False)
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


def main() -> None:
    guard.install()
    request = json.loads(Path(sys.argv[1]).read_text())
    root = Path(request["root"]).resolve()

    from traingate.stages.harness.pytest_plugin import EventRecorder, install_warning_sites

    recorder = EventRecorder(request["events"], root)
    install_warning_sites()
    plugins: list[Any] = [recorder]
    if request.get("coverage"):
        plugins.append(CoverageWindow(request["coverage"]))
    # What `python -m pytest` in the target's root gives its tests: the root first on sys.path
    # (this process started without it, so that nothing there could shadow traingate).
    sys.path.insert(0, str(root))
    try:
        code = int(pytest.main(request["args"], plugins=plugins))
    finally:
        recorder.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # Threads or atexit hooks the tests left behind must not change an outcome already written.
    os._exit(code)


if __name__ == "__main__":
    main()
