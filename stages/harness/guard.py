"""First thing every child process runs: make its stacks recoverable.

- SIGUSR1 dumps every thread's stack (the parent sends it on overrun, then kills the group);
- fatal signals (SIGSEGV, SIGABRT, ...) dump the crashing stack;
- a call that kills the process itself (`os.kill(os.getpid(), ...)`, `os.abort()`,
  `signal.raise_signal`, `os._exit`) dumps the caller's stack first, because SIGKILL leaves
  no other trace of where it came from.
All dumps go to the file named by TRAINGATE_STACKS_FILE, in faulthandler's format.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from typing import Any, TextIO

_stream: TextIO | None = None


def install() -> None:
    global _stream
    path = os.environ.get("TRAINGATE_STACKS_FILE")
    if not path or _stream is not None:
        return
    _stream = open(path, "a", buffering=1, encoding="utf-8")
    _stream.write(f"# traingate main pid {os.getpid()} thread {threading.main_thread().ident:#x}\n")
    faulthandler.register(signal.SIGUSR1, file=_stream, all_threads=True, chain=False)
    faulthandler.enable(file=_stream, all_threads=True)
    _wrap_self_kill()


def _note_self_signal(what: str) -> None:
    if _stream is None:
        return
    _stream.write(f"# traingate self-signal {what} pid {os.getpid()}\n")
    _stream.flush()
    faulthandler.dump_traceback(file=_stream, all_threads=False)
    _stream.flush()


def _wrap_self_kill() -> None:
    real_kill, real_abort, real_raise, real_exit = os.kill, os.abort, signal.raise_signal, os._exit

    def kill(pid: int, sig: int, /) -> None:
        if pid in (0, os.getpid()) and sig not in (0, signal.SIGUSR1):
            _note_self_signal(signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig))
        real_kill(pid, sig)

    def abort() -> Any:
        _note_self_signal("SIGABRT")
        return real_abort()

    def raise_signal(sig: int, /) -> None:
        _note_self_signal(signal.Signals(sig).name)
        real_raise(sig)

    def _exit(code: int, /) -> Any:
        if code != 0 and os.getpid() == _main_pid:
            _note_self_signal(f"os._exit({code})")
        return real_exit(code)

    _main_pid = os.getpid()
    os.kill, os.abort, signal.raise_signal, os._exit = kill, abort, raise_signal, _exit  # type: ignore[assignment]
