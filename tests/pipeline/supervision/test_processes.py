"""Finding a process's descendants in /proc: one scan of every process's state and parent, the
command lines read for the descendants only, and before `skip` judges them."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from traingate.pipeline.supervision.processes import descendants, kill, kill_descendants, process_table, read_process, reap

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")

MARKER = "sleep 29.71828"  # a duration no other process of the machine sleeps for


def _shell_with_a_sleeping_child() -> subprocess.Popen[bytes]:
    # The shell's child is a grandchild of this process, its command line the marker.
    shell = subprocess.Popen(["sh", "-c", f"{MARKER} & wait"])
    deadline = time.monotonic() + 10
    while not any(p.cmdline == MARKER for p in descendants(os.getpid())) and time.monotonic() < deadline:
        time.sleep(0.02)
    return shell


def test_the_scan_reads_command_lines_for_the_descendants_only() -> None:
    shell = _shell_with_a_sleeping_child()
    try:
        found = {p.pid: p for p in descendants(os.getpid())}
        [sleeper] = [p for p in found.values() if p.cmdline == MARKER]
        assert sleeper.ppid == shell.pid and found[shell.pid].cmdline.startswith("sh -c")
        bare = process_table(cmdlines=False)
        assert bare[sleeper.pid].cmdline == "" and bare[sleeper.pid].ppid == shell.pid
        assert MARKER in process_table()[sleeper.pid].cmdline
        assert read_process(sleeper.pid, cmdline=False).cmdline == ""  # type: ignore[union-attr]
    finally:
        kill_descendants(shell.pid)  # only what the test started: a worker keeps others (warm pools)
        shell.wait()


def test_skip_judges_a_descendant_by_its_command_line() -> None:
    shell = _shell_with_a_sleeping_child()
    me = os.getpid()
    others = {p.pid for p in descendants(me) if p.ppid == me and p.pid != shell.pid}  # a worker's own (warm pools)
    try:
        left = kill_descendants(skip=lambda p: p.cmdline == MARKER or p.pid in others)
        assert [p.pid for p in left] == [shell.pid]  # the shell, not the sleep it started
        assert read_process(shell.pid) is None  # killed, and reaped: it was this process's child
        shell.wait(timeout=10)  # its status is gone with it: only Popen's own record is closed
        [sleeper] = [p for p in descendants(me) if p.cmdline == MARKER]
        assert sleeper.alive
    finally:
        sleepers = [p.pid for p in descendants(me) if p.cmdline == MARKER]
        kill(sleepers)
        reap(sleepers)  # handed to this process (a subreaper) when the shell died
