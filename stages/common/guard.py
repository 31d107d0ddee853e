"""First thing every child process runs: make its stacks recoverable.

- SIGUSR1 dumps every thread's stack (the parent sends it on overrun, then kills the group);
- fatal signals (SIGSEGV, SIGABRT, ...) dump the crashing stack;
- a call that kills the process itself (`os.kill(os.getpid(), ...)`, `os.abort()`,
  `signal.raise_signal`, `os._exit`) dumps the caller's stack first, because SIGKILL leaves
  no other trace of where it came from. `os._exit(0)` counts too until the harness has
  handed back its result: the target ending the process "successfully" is still a crash.
All dumps go to the file named by STACKS_ENV, in faulthandler's format, with the header
lines of `stages/common/stacks.py`.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from typing import Any, NoReturn, TextIO

from .stacks import STACKS_ENV, main_header, self_signal_header

_stream: TextIO | None = None
_real_exit = os._exit
_harness_done = False
_main_pid = os.getpid()
_wrapped = False


def install() -> None:
    global _stream
    path = os.environ.get(STACKS_ENV)
    if not path or _stream is not None:
        return
    _stream = open(path, "a", buffering=1, encoding="utf-8")
    _stream.write(main_header(os.getpid(), threading.main_thread().ident or 0))
    faulthandler.register(signal.SIGUSR1, file=_stream, all_threads=True, chain=False)
    faulthandler.enable(file=_stream, all_threads=True)
    _wrap_self_kill()


def install_in_worker(path: str) -> None:
    """`install` for a worker process the harness started (a rank of a distributed run): its
    dumps go to its own file, and this process, not its parent, is the one whose self-exit
    is noted. Works in a forked worker (the parent's setup inherited) and a spawned one."""
    global _stream, _main_pid, _harness_done
    _stream = open(path, "a", buffering=1, encoding="utf-8")
    _stream.write(main_header(os.getpid(), threading.main_thread().ident or 0))
    faulthandler.register(signal.SIGUSR1, file=_stream, all_threads=True, chain=False)
    faulthandler.enable(file=_stream, all_threads=True)
    if not _wrapped:
        _wrap_self_kill()
    _main_pid, _harness_done = os.getpid(), False


def mark_reported() -> None:
    """The worker handed back its result: from here on, `os._exit(0)` is its normal end."""
    global _harness_done
    _harness_done = True


def _note_self_signal(what: str) -> None:
    if _stream is None:
        return
    _stream.write(self_signal_header(what, os.getpid()))
    _stream.flush()
    faulthandler.dump_traceback(file=_stream, all_threads=False)
    _stream.flush()


def _wrap_self_kill() -> None:
    global _wrapped, _main_pid
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
        if os.getpid() == _main_pid and (code != 0 or not _harness_done):
            _note_self_signal(f"os._exit({code})")
        return real_exit(code)

    _main_pid, _wrapped = os.getpid(), True
    os.kill, os.abort, signal.raise_signal, os._exit = kill, abort, raise_signal, _exit  # type: ignore[assignment]


def exit_after_reporting(code: int) -> NoReturn:
    """The harness's own last call, once its result is handed back: skip interpreter
    teardown (the target's threads or atexit hooks must not change what was reported) and
    leave no self-exit note, so a note means the target ended the process itself."""
    global _harness_done
    _harness_done = True
    _real_exit(code)
