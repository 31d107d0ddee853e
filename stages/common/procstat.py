"""`/proc/<pid>/stat`, read the one way both sides of the gate need it (Linux only), where an
entry lies in this process's environment block and how it is written over, the signal both
sides send to a process that may already be gone, and the CPUs a process may use."""

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


def environment_entry(name: str) -> tuple[int, int] | None:
    """Where the entry `name=...` lies in the environment block this process was started with
    (the memory `/proc/<pid>/environ` reads, which a fork without an exec keeps): its address
    and its length in bytes; None when it is not there or cannot be read."""
    fields = read_stat()
    try:
        with open("/proc/self/environ", "rb") as environ:
            block = environ.read()
    except OSError:
        return None
    if fields is None:
        return None
    key = name.encode() + b"="
    if block.startswith(key):
        at = 0
    elif (found := block.find(b"\0" + key)) >= 0:
        at = found + 1
    else:
        return None
    end = block.find(b"\0", at)
    env_start = int(fields[47])  # field 50 of proc(5); fields[0] is field 3
    return env_start + at, (end if end >= 0 else len(block)) - at


def overwrite_environment(where: tuple[int, int], data: bytes) -> bool:
    """Write `data`, padded with spaces, over the `where` (address, length) of this process's
    environment block (`environment_entry`): a process forked without an exec shows that block
    in `/proc/<pid>/environ`. Whether it was written (not when `data` is longer)."""
    start, width = where
    if len(data) > width:
        return False
    try:
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            return mem.write(data.ljust(width)) == width
    except OSError:
        return False


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
