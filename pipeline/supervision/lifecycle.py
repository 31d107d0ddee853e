"""One run per output folder, reports that appear whole, and a clean stop on SIGINT/SIGTERM.

- `claim_output` takes an advisory lock (`flock`) on `.traingate.lock` inside `--out`; a second
  run on the same folder is refused before it touches anything, and the run that holds it
  first removes the reports and `work/` of any earlier run, so nothing stale looks current.
- `write_atomic` writes a file next to its destination and renames it into place, so a reader
  never sees half a report.
- `interrupt_handling` turns SIGINT and SIGTERM into `Interrupted`, which unwinds the run
  (each child's process group is killed on the way); `stop_after_interrupt` then kills every
  remaining descendant and removes this run's reports: an interrupted run leaves no verdict.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from traingate.pipeline.supervision.processes import kill_descendants

LOCK_NAME = ".traingate.lock"
WORK_DIR = "work"
# Every report file a run may write (pipeline/gate/outputs.py), removed before a run and after an interruption.
REPORT_FILES = ("report.json", "report.md", "report.sarif", "report.junit.xml")


class OutputBusy(Exception):
    """Another traingate run holds the output folder."""


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; a BaseException so no `except Exception` swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


class OutputClaim:
    """The lock on one output folder, held until `release` (or until this process ends)."""

    def __init__(self, out: Path, fd: int, report_files: list[str]) -> None:
        self.out = out
        self._fd: int | None = fd
        self.report_files = report_files

    def clear_reports(self) -> None:
        """Remove every report file and the temporary files of unfinished writes."""
        for name in self.report_files:
            (self.out / name).unlink(missing_ok=True)
        for leftover in self.out.glob(".*.tmp"):
            leftover.unlink(missing_ok=True)

    def clear_work(self) -> None:
        work = self.out / WORK_DIR
        if work.is_symlink() or work.is_file():
            work.unlink()
        elif work.is_dir():
            shutil.rmtree(work, ignore_errors=True)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


_current: OutputClaim | None = None


def claim_output(out: Path, stage_names: Iterable[str]) -> OutputClaim:
    """Lock `out` for this run and clear what an earlier run left there.

    Raises OutputBusy, having changed nothing in the folder, when another run holds it.
    """
    global _current
    lock_path = out / LOCK_NAME
    # O_CLOEXEC: no child inherits the descriptor, so no leftover process can hold the lock.
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip()
        os.close(fd)
        by = f" (pid {holder})" if holder.isdigit() else ""
        raise OutputBusy(f"--out: {out} is in use by another traingate run{by}; wait for it to finish or choose another --out") from None
    except OSError:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    claim = OutputClaim(out, fd, [*REPORT_FILES, *(f"{name}.md" for name in stage_names)])
    claim.clear_reports()
    claim.clear_work()
    _current = claim
    return claim


def release_output() -> None:
    global _current
    if _current is not None:
        _current.release()
        _current = None


def write_atomic(path: Path, text: str) -> None:
    """Write `path` whole or not at all: a temporary file in the same folder, then a rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def interrupt_handling() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` in the main thread while the block runs."""

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        # A second signal must not cut the cleanup short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Interrupted(signum)

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def stop_after_interrupt() -> None:
    """Kill every process this run started and remove its reports: no verdict is left."""
    kill_descendants()
    if _current is not None:
        _current.clear_reports()
