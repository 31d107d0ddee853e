"""Which of the target's files its processes opened for reading, recorded by an audit hook.

The gate tells tampering from results by observation (docs/contract.md, "Files the run
rewrote"): a tracked file the run rewrote blocks when the run read it. Every child that runs
target code (the pytest launcher, the entrypoint harness) installs this hook before any target
code runs; it sees every `open` event (`open()`, `io.open`, `os.open`, the import system's
`io.open_code`) of the process, keeps those that can read a file under the target's root, and
the harness hands the set back with its result over the channel.

Audit hooks cannot be removed, and the set lives only in the hook's closure, whose collector
only the harness holds. Processes forked from this one (DataLoader workers, CPU ranks) inherit
the hook; they send what they read over a pipe opened here, which the collector drains, and
mark in a page they share any read they could not send (the pipe was full). A record so
marked, or one that is missing, is incomplete, and the gate treats every rewritten file as
read: it fails closed.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import secrets
import select
import sys
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ConfigDict

# Where the pipe's ends are moved: out of the range a target probes first, like the channel.
_HIDE_FROM, _HIDE_TO = 300, 900
# Forked processes write one line per path, each at most PIPE_BUF bytes (written whole or not
# at all); a write the pipe refused marks the record incomplete in a page they share.
_PIPE_BYTES = 1 << 20
_READ_FLAGS = (os.O_RDONLY, os.O_RDWR)


class FilesRead(BaseModel):
    """What one run (or a stage's runs together) opened for reading under the target's root."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paths: list[str]  # relative to the target's root, posix, sorted
    complete: bool = True
    why_incomplete: str | None = None


def opens_for_reading(mode: Any, flags: Any) -> bool:
    """An `open` event's mode (a str from `open()`, None from `os.open`) or flags can read the
    file's present content: 'w' truncates first, so only 'r', 'r+', 'a+' and their flag forms."""
    if isinstance(mode, str):
        return "r" in mode or ("a" in mode and "+" in mode)
    if isinstance(flags, int):
        return (flags & os.O_ACCMODE) in _READ_FLAGS and not flags & os.O_TRUNC
    return False


def relative_under(path: Any, roots: tuple[str, ...], skipped: tuple[str, ...] = ()) -> str | None:
    """`path` (str, bytes or path-like, relative to the working folder) as a posix path
    relative to `roots[0]` (the root's real path), when it resolves there: symlinks are
    followed, so a link to a tracked file (or a path through `/proc/self/cwd`) counts as that
    file. A path under one of `skipped` (the interpreter's own folders) and not under `roots`
    is not resolved: the imports of the interpreter's packages cost one string test."""
    if isinstance(path, int):
        return None  # an open descriptor: the file was opened, and recorded, by name before
    text = os.path.abspath(os.fsdecode(os.fspath(path)))
    if text.startswith(skipped) and not text.startswith(roots):
        return None
    real = os.path.realpath(text)
    if not real.startswith(roots[0]):
        return None
    return os.path.relpath(real, roots[0]).replace(os.sep, "/")


def _interpreter_folders() -> tuple[str, ...]:
    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    return tuple(os.path.join(os.path.abspath(f), "") for f in folders if f)


def install(root: str, pipe_bytes: int = _PIPE_BYTES) -> Callable[[], FilesRead]:
    """Start recording, in this process and the ones forked from it; the returned collector
    gives the record so far (call it once, in the process that installed the hook)."""
    roots = tuple(os.path.join(r, "") for r in (os.path.realpath(root), os.path.abspath(root)))
    skipped = _interpreter_folders()
    owner = os.getpid()
    seen: set[str] = set()
    receive, send = (_hide(fd) for fd in os.pipe())
    try:
        fcntl.fcntl(send, fcntl.F_SETPIPE_SZ, pipe_bytes)
    except (OSError, AttributeError):
        pass
    os.set_blocking(send, False)  # a full pipe must never stall a worker: it marks the loss instead
    lost = mmap.mmap(-1, 1)  # anonymous and shared: a forked worker's mark reaches the collector

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event != "open":
            return
        try:
            if len(args) < 3 or not opens_for_reading(args[1], args[2]):
                return
            rel = relative_under(args[0], roots, skipped)
            if rel is None or rel in seen:
                return
            seen.add(rel)
            if os.getpid() != owner:
                _send_line(send, rel.encode("utf-8", "surrogateescape") + b"\n", lost)
        except Exception:  # noqa: BLE001 - recording must never change what the target's open does
            lost[0] = 1

    def collect() -> FilesRead:
        received = _drain(receive)
        forked = {line.decode("utf-8", "surrogateescape") for line in received.split(b"\n") if line}
        paths = sorted(seen | forked)
        if lost[0]:
            return FilesRead(paths=paths, complete=False, why_incomplete="a process of the run could not record all it read (its pipe to the harness filled)")
        return FilesRead(paths=paths)

    sys.addaudithook(hook)
    return collect


def _send_line(fd: int, line: bytes, lost: mmap.mmap) -> None:
    if len(line) > select.PIPE_BUF:
        lost[0] = 1  # would not be written whole: another worker's line could land inside it
        return
    try:
        os.write(fd, line)
    except OSError:
        lost[0] = 1


def _drain(fd: int) -> bytes:
    os.set_blocking(fd, False)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def _hide(fd: int) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _HIDE_FROM + secrets.randbelow(_HIDE_TO - _HIDE_FROM))
    os.close(fd)
    return moved


def combined(records: list[FilesRead | None]) -> FilesRead:
    """One record for a stage's runs (None: a run that handed back no record, because it died,
    overran or sent a result the gate rejected): incomplete when any of them is."""
    paths = sorted({p for r in records if r is not None for p in r.paths})
    missing = sum(r is None for r in records)
    partial = [r.why_incomplete or "a run's record is incomplete" for r in records if r is not None and not r.complete]
    if missing:
        partial.insert(0, f"{missing} of the stage's {len(records)} run(s) handed back no record of what they read")
    if partial:
        return FilesRead(paths=paths, complete=False, why_incomplete="; ".join(dict.fromkeys(partial)))
    return FilesRead(paths=paths)
