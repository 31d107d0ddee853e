"""`/proc/<pid>/stat`, read the one way both sides of the gate need it (Linux only), the
signal both sides send to a process that may already be gone, and the CPUs a process may use."""

from __future__ import annotations

import os
import signal


def stat_fields(text: str) -> list[str]:
    """The fields after the command name, from field 3 (the state) on, as proc(5) numbers them:
    the name is in parentheses and may itself hold spaces and parentheses."""
    return text.rsplit(")", 1)[1].split()


def read_stat(pid: int | str = "self") -> list[str] | None:
    """`stat_fields` of process `pid`; None when it is gone or unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as stat:
            return stat_fields(stat.read())
    except (OSError, IndexError):
        return None


def send_signal(pid: int, sig: signal.Signals) -> None:
    """`os.kill`, where a process already gone, or no longer ours to signal, is not an error."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask: what the runner gives), or the
    machine's count where the platform has no mask."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
