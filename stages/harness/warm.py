"""A warm interpreter: torch imported once, then one forked process per entrypoint run.

Most of a child run's time is `import torch` (and `torch._dynamo`, which every optimizer's
construction imports): about 2 s of CPU before the target's first line. A stage that calls the
entrypoint several times with the same environment (the performance stage's profile and timing
runs, the correctness stage's extra runs) starts this interpreter once, with the environment
its runs get; each run is then a fork of it, as a DataLoader worker is a fork of a process that
imported torch. The fork then becomes what `python -P -m MODULE` would have been: a session
of its own, the run's stdin, stdout, stderr and channel on their numbers, the run's
environment, and the module run as `__main__`. Only modules are imported here, never run: no
torch operation, no thread of its own, no CUDA context, so a fork of it is as safe as a
DataLoader worker.

Protocol (one Unix SEQPACKET socket, its number in argv[1]): the interpreter sends `ready`
once imported (`unusable`, and ends, when the imports failed, warned or printed: the runs then
start fresh, as they would have); then, one run at a time, it receives a JSON request with the run's file
descriptors [stdin, stdout, stderr, (channel)], forks, sends `pid N`, waits for that process
and sends `status N` (the exit code as `subprocess` writes it: negative for a signal). The
socket closing ends it. The parent side is `traingate.pipeline.warm`.
"""

from __future__ import annotations

import fcntl
import json
import os
import runpy
import signal
import socket
import sys
import warnings
from typing import Any

_MAX_FDS = 4
_MAX_MESSAGE = 1 << 20


def _preload() -> bool:
    """Import what every run imports; whether that was silent. A fresh child imports torch
    under the harness's warning log, so an import that warns or prints (torch without numpy,
    say) would leave that out of every forked run's record: then nothing is forked."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            # Imported for the forks, not used here.
            import torch
            import torch._dynamo  # noqa: F401
        except BaseException:  # noqa: BLE001 - a target environment may have anything installed
            return False
    return not caught and os.fstat(1).st_size == 0 and os.fstat(2).st_size == 0


def _become_run(request: dict[str, Any], fds: list[int], sock: socket.socket, settle: int) -> str:
    """In the forked process: take the run's session, descriptors, environment and folder."""
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    os.setsid()
    os.close(settle)  # now in its own session: the interpreter may hand out the pid
    sock.close()
    targets = [0, 1, 2] + ([int(request["channel_fd"])] if len(fds) > 3 else [])
    # Move every received descriptor above every target number first, so no dup2 below
    # overwrites one that is still to be placed.
    floor = max([*targets, *fds]) + 1
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    return str(request["module"])


def serve(sock: socket.socket) -> str | None:
    """Fork one process per request; in the fork, return the module it runs."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a stack-dump request to the group is not for us
    if not _preload():
        sock.sendall(b"unusable")
        return None
    sock.sendall(b"ready")
    while True:
        try:
            message, fds, _flags, _address = socket.recv_fds(sock, _MAX_MESSAGE, _MAX_FDS)
        except OSError:
            return None
        if not message:
            return None
        request = json.loads(message)
        # The pid goes back only once the fork leads its own session: a kill of its process
        # group (the budget's) must never miss it, as `start_new_session` guarantees.
        settled, settle = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(settled)
            return _become_run(request, fds, sock, settle)
        os.close(settle)
        for fd in fds:
            os.close(fd)
        os.read(settled, 1)  # end of file: the fork closed its end, in its session or dead
        os.close(settled)
        sock.sendall(f"pid {pid}".encode())
        _, status = os.waitpid(pid, 0)
        sock.sendall(f"status {os.waitstatus_to_exitcode(status)}".encode())


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    module = serve(sock)
    if module is None:
        return
    sys.argv = [module]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
