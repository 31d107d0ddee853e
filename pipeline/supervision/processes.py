"""Every process started below this one, however it tried to leave: find it, kill it, reap it.

A child that double-forks and calls `setsid` leaves its process group and its session, so
killing the group misses it, and when its parent exits the kernel hands it to init. A *child
subreaper* (Linux `prctl(PR_SET_CHILD_SUBREAPER)`) receives such orphans instead, so every
process started below it stays its descendant until it is killed and reaped. The gate's main
process and each stage agent make themselves subreapers; elsewhere than Linux this is a no-op
and only the process group of each child is killed.

Descendants are found from /proc (the parent-pid chain), in one scan of the process table
(each process's `stat`; the command lines of the descendants only).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from traingate.stages.common.procstat import stat_fields

# Processes this one started to keep for its whole life (an import server,
# `import_server.start`): no sweep for leftovers takes them, or what runs below them.
KEPT: set[int] = set()

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_PROC = Path("/proc")
_DEAD_STATES = frozenset({"Z", "X", "x"})


@dataclass(frozen=True)
class ProcessInfo:
    """One process as /proc shows it."""

    pid: int
    ppid: int
    pgid: int
    sid: int
    state: str
    cmdline: str

    @property
    def alive(self) -> bool:
        return self.state not in _DEAD_STATES

    def as_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "ppid": self.ppid, "pgid": self.pgid, "sid": self.sid, "state": self.state, "cmdline": self.cmdline}


def become_subreaper() -> bool:
    """Make orphans of this process's descendants this process's children (Linux only).

    Returns whether it took effect; elsewhere it does nothing and returns False.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def is_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        if int(libc.prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0)) != 0:
            return False
        return flag.value != 0
    except (OSError, AttributeError):
        return False


def _read_proc(pid: int | str, name: str) -> bytes:
    """`/proc/<pid>/<name>` as bytes, with plain descriptor calls: a scan reads one file per
    process on the machine, and pathlib's objects cost more than the read itself."""
    fd = os.open(f"/proc/{pid}/{name}", os.O_RDONLY)
    try:
        parts = []
        while chunk := os.read(fd, 65536):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def read_cmdline(pid: int) -> str:
    """The command line of `pid` as one string ("" when it is gone or has none)."""
    try:
        return _read_proc(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()[:500]
    except OSError:
        return ""


def read_process(pid: int, *, cmdline: bool = True) -> ProcessInfo | None:
    """The process `pid`, or None when it is gone (or /proc is not there). Without `cmdline`,
    its command line is left empty (`with_cmdline` reads it later, while it still runs)."""
    try:
        fields = stat_fields(_read_proc(pid, "stat").decode(errors="replace"))
        state, ppid, pgid, sid = fields[0], int(fields[1]), int(fields[2]), int(fields[3])
    except (OSError, ValueError, IndexError):
        return None
    return ProcessInfo(pid=pid, ppid=ppid, pgid=pgid, sid=sid, state=state, cmdline=read_cmdline(pid) if cmdline else "")


def with_cmdline(info: ProcessInfo) -> ProcessInfo:
    """`info` with its command line, read now where a scan left it out."""
    return info if info.cmdline else replace(info, cmdline=read_cmdline(info.pid))


def process_table(*, cmdlines: bool = True) -> dict[int, ProcessInfo]:
    """Every process this user can see, by pid (empty where there is no /proc); without
    `cmdlines`, their command lines are left empty: a scan for one process's descendants
    reads one file per process instead of two, and only the descendants' command lines."""
    table: dict[int, ProcessInfo] = {}
    try:
        names = os.listdir(_PROC)
    except OSError:
        return table
    for name in names:
        if name.isdigit():
            info = read_process(int(name), cmdline=cmdlines)
            if info is not None:
                table[info.pid] = info
    return table


def descendants(
    root: int,
    table: dict[int, ProcessInfo] | None = None,
    *,
    skip: Callable[[ProcessInfo], bool] | None = None,
) -> list[ProcessInfo]:
    """Every descendant of `root` (not `root` itself), parents before children.

    A process for which `skip` says True is left out together with everything below it. The
    scan reads each process's state and parents only; a descendant's command line is read
    when it is found (where `table` lacks it), before `skip` sees it.
    """
    table = process_table(cmdlines=False) if table is None else table
    children: dict[int, list[ProcessInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    found: list[ProcessInfo] = []
    frontier = [root]
    seen = {root}
    while frontier:
        parent = frontier.pop()
        for child in sorted(children.get(parent, []), key=lambda p: p.pid):
            if child.pid in seen:
                continue
            child = with_cmdline(child)
            if skip is not None and skip(child):
                continue
            seen.add(child.pid)
            found.append(child)
            frontier.append(child.pid)
    return found


def environment_value(pid: int, name: str) -> str | None:
    """`name` in the environment `pid` was started with (None when unreadable or unset)."""
    try:
        raw = (_PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return None
    prefix = name.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def kill(pids: Iterable[int]) -> None:
    """SIGKILL each pid; ones already gone are fine."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def kill_group(pgid: int) -> None:
    """SIGKILL every process of group `pgid`; a group already gone is fine."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap(pids: Iterable[int]) -> None:
    """Collect the exit status of those of `pids` that are this process's exited children.

    Only pids the caller knows to be its own and held by nobody else in this process (no
    `subprocess.Popen` waits on them), so no one else's exit status is taken.
    """
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except (ChildProcessError, OSError):
            pass


def kill_descendants(
    root: int | None = None,
    *,
    skip: Callable[[ProcessInfo], bool] | None = None,
    timeout_s: float = 5.0,
) -> list[ProcessInfo]:
    """Kill every descendant of `root` (default: this process) and reap the ones that are ours,
    but those `skip` names and the processes this one keeps (`KEPT`), with what is below them.

    Scans again after each round of kills, because a process may fork between the scan and
    the kill; its children come back to us (a subreaper) and show up in the next scan. Returns
    each process as first seen, alive or not.
    """
    me = os.getpid()
    root = me if root is None else root
    first_seen: dict[int, ProcessInfo] = {}
    deadline = time.monotonic() + timeout_s

    def passed_over(info: ProcessInfo) -> bool:
        return info.pid in KEPT or (skip is not None and skip(info))

    while True:
        found = descendants(root, skip=passed_over)
        for info in found:
            first_seen.setdefault(info.pid, info)
        alive = [p.pid for p in found if p.alive]
        ours = [p.pid for p in found if p.ppid == me]
        kill(alive)
        reap(ours)
        # A zombie whose parent is not us is its parent's to reap; it runs nothing.
        if (not alive and not ours) or time.monotonic() > deadline:
            return list(first_seen.values())
        time.sleep(0.01)


