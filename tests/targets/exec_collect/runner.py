"""Planted: the entrypoint's helper kills its own process with SIGKILL."""

import os
import signal


def _abort_run() -> None:
    os.kill(os.getpid(), signal.SIGKILL)  # planted: death by signal


def main() -> int:
    print("starting the run")
    _abort_run()
    return 0
