"""A test that detaches a sleeping daemon and then sleeps itself: traingate is stopped
(SIGINT/SIGTERM) while it runs."""

import os
import sys
import time

MARKER = "traingate-sleeper-daemon"


def _detach_sleeper() -> None:
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", MARKER])
        os._exit(0)
    os.waitpid(first, 0)


def test_sleeps_long():
    _detach_sleeper()
    time.sleep(300)
