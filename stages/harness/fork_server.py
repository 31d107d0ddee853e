"""A warm interpreter: torch imported once, then one forked process per child run.

Most of a child run's time is `import torch` (and `torch._dynamo`, which every optimizer's
construction imports): about 2 s of CPU before the target's first line. A stage whose runs
share an environment (the performance stage's profile and timing runs, the execution stage's
pytest run and smoke calls) starts this interpreter once, with the environment its runs get;
each run is then a fork of it, as a DataLoader worker is a fork of a process that imported
torch. The fork then becomes what `python -P -m MODULE` would have been: a session of its own,
the run's stdin, stdout, stderr and channel on their numbers, the run's environment (its run
tag written into the environment block `/proc/<pid>/environ` shows, so that its orphans name
their run as a fresh child's would), and the module run as `__main__`. Only modules are
imported here, never run: no torch operation, no thread of its own, no CUDA context, so a fork
of it is as safe as a DataLoader worker.

Protocol: one Unix SEQPACKET socket, its number in argv[1]. The interpreter sends `ready` once
imported (`unusable`, and ends, when the imports failed, warned or printed, or when it could not
retag a fork: the runs then start fresh, as they would have). Each request is a JSON message
with the descriptors [status socket, stdin, stdout, stderr, (channel)]; on the run's own status
socket the interpreter answers `pid N` once the fork leads its session (`failed` when the fork
could not become the run), then `status N` when it ends (the exit code as `subprocess` writes
it: negative for a signal). Runs may overlap. A request with `hand_down` (a stage agent's, from
the gate's agents' host) has the fork fork once more before it becomes the run: an interpreter
with these imports for the agent's runs (`_hand_down`). The main socket closing ends the
interpreter. The parent side is `pipeline/supervision/warm.py`.
"""

from __future__ import annotations

import fcntl
import gc
import importlib
import json
import os
import runpy
import select
import signal
import socket
import sys
import warnings
from typing import Any

from ..common import inherited
from ..common.collector import collector_paused
from ..common.procstat import environment_entry, overwrite_environment
from ..common.stacks import RUN_TAG_ENV

_MAX_FDS = 5
# What a warm interpreter may import besides torch and the harness, when its runs all run a
# test as their entrypoint (the parent asks for it in argv): pytest, whose import every such
# run would repeat.
PRELOADABLE = frozenset({"pytest"})
_MAX_MESSAGE = 1 << 20
# The environment this interpreter started with: what its imports saw (importing torch sets
# variables of its own), which a handed-down interpreter's runs must have.
_START_ENV = dict(os.environ)
# The gate's import root, where an agents' preload (`inherited.agents_preload_arg`) imported its
# modules here: gate-side modules, which the forks that run target code forget (`_forget_gate`).
_gate_root: str | None = None


def _preload(extra: list[str]) -> bool:
    """Import what every run imports (and `extra`, of `PRELOADABLE`); whether that was silent.
    A fresh child imports torch under the harness's warning log, so an import that warns or
    prints (torch without numpy, say) would leave that out of every forked run's record: then
    nothing is forked."""
    with warnings.catch_warnings(record=True) as caught, collector_paused():
        warnings.simplefilter("always")
        try:
            # Imported for the forks, not used here.
            import torch
            import torch._dynamo  # noqa: F401

            for name in extra:
                if name in PRELOADABLE:
                    importlib.import_module(name)
        except BaseException:  # noqa: BLE001 - a target environment may have anything installed
            return False
        _preload_harness()
        for name in extra:
            module = inherited.agents_preload_module(name)
            if module is not None and not _prepare_agents(module):
                return False
    return not caught and os.fstat(1).st_size == 0 and os.fstat(2).st_size == 0


def _preload_harness() -> None:
    """What the entrypoint harness imports before any target code (pydantic, the contract):
    imported here once, the harness module itself then forgotten, so that each fork runs it
    as `__main__` afresh (runpy warns about a module run that is already imported)."""
    name = f"{__package__}.entrypoint"  # under the name this package runs as (the copy's in a run)
    importlib.import_module(name)
    del sys.modules[name]
    package, _, attr = name.rpartition(".")
    delattr(sys.modules[package], attr)


def _prepare_agents(module: str) -> bool:
    """Run `module.prepare()` (the gate's, for the stage agents forked here); whether it did."""
    global _gate_root
    _gate_root = module.partition(".")[0]
    try:
        importlib.import_module(module).prepare()
    except Exception:  # noqa: BLE001 - then the agents' host is unusable, and the agents start fresh
        return False
    return True


def _forget_gate() -> None:
    """In a fork that runs target code: the gate's modules an agents' preload imported are not
    in its `sys.modules` (a fresh child has none of them)."""
    if _gate_root is None:
        return
    for name in list(sys.modules):
        if name == _gate_root or name.startswith(f"{_gate_root}."):
            del sys.modules[name]


def _tag_address() -> tuple[int, int] | None:
    """Where this process's run tag lies in the environment block it was started with (the
    memory `/proc/<pid>/environ` reads) and how many bytes it has; None when it cannot be found."""
    entry = environment_entry(RUN_TAG_ENV)
    if entry is None:
        return None
    key = len(RUN_TAG_ENV) + 1  # `NAME=`
    return entry[0] + key, entry[1] - key


def _retag(address: tuple[int, int], tag: str) -> bool:
    """Write `tag` over the inherited one in this (forked) process's environment block, padded
    with spaces to the same length."""
    return overwrite_environment(address, tag.encode())


def _become_run(request: dict[str, Any], fds: list[int], held_sockets: list[socket.socket], pidfds: list[int], settle: int, address: tuple[int, int]) -> str:
    """In the forked process: take the run's session, tag, descriptors, environment and folder
    (first handing a warm interpreter of its own down to it, when the run is a stage agent)."""
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    os.setsid()
    if not _retag(address, str(request["env"].get(RUN_TAG_ENV, ""))):
        os.write(settle, b"!")
        os._exit(0)
    # Nothing of the interpreter's or of another run's reaches the run: the main socket, the
    # other runs' status sockets and pid descriptors, and this run's own status socket
    # (detached first, so that no socket object closes a number the run reuses later).
    for held in held_sockets:
        os.close(held.detach())
    for pidfd in pidfds:
        os.close(pidfd)
    os.close(settle)  # in its own session, retagged: the interpreter may hand out the pid
    targets = [0, 1, 2] + ([int(request["channel_fd"])] if len(fds) > 3 else [])
    # Every descriptor kept goes above every target number first, so no dup2 below overwrites
    # one that is still to be placed, or the handed-down interpreter's socket.
    floor = max([*targets, *fds]) + 1
    if request.get("hand_down"):
        module = _hand_down(address, fds, floor)
        if module is not None:  # this process is a run of the handed-down interpreter
            return module
    else:  # a run of target code (a stage agent is the gate's)
        _forget_gate()
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, floor) for fd in fds]
    for fd in fds:
        os.close(fd)
    for fd, target in zip(moved, targets, strict=True):
        os.dup2(fd, target, inheritable=True)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    # The one start-up flag an environment variable sets that a run's environment may differ in.
    sys.dont_write_bytecode = bool(request["env"].get("PYTHONDONTWRITEBYTECODE"))
    os.chdir(request["cwd"])
    return str(request["module"])


def _hand_down(address: tuple[int, int], run_fds: list[int], floor: int) -> str | None:
    """In a fork that becomes a stage agent: fork once more, before the agent's code runs, an
    interpreter that keeps this one's imports and environment and serves the agent's runs
    (`stages/common/inherited.py`). Returns in the agent (None) and in each run of
    that interpreter (the module the run runs); the interpreter itself ends here."""
    home_cwd = os.getcwd()
    agent_end, interpreter_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        pid = os.fork()
    except OSError:  # the agent starts an interpreter of its own at its first run
        agent_end.close()
        interpreter_end.close()
        return None
    if pid == 0:
        agent_end.close()
        for fd in run_fds:  # the agent's stdin, output and channel are not the interpreter's
            os.close(fd)
        module = serve(interpreter_end, imported=True, address=address)
        if module is None:
            os._exit(0)  # nothing of the agent's may run here: no cleanup, no atexit
        return module
    interpreter_end.close()
    # Its socket is kept at `floor` or above, out of the way of the agent's descriptors.
    socket_fd = fcntl.fcntl(agent_end.fileno(), fcntl.F_DUPFD_CLOEXEC, floor)
    agent_end.close()
    # The agent's collections would walk (and copy, page by page) every object of torch's it
    # inherited: a second or more each time. It never frees them, so they are set aside.
    gc.freeze()
    inherited.handed_down = inherited.InheritedWarm(pid=pid, socket_fd=socket_fd, env=dict(_START_ENV), cwd=home_cwd)
    return None


class _Runs:
    """The forks running now: pid descriptor -> (pid, the run's status socket)."""

    def __init__(self) -> None:
        self.by_pidfd: dict[int, tuple[int, socket.socket]] = {}

    def sockets(self) -> list[socket.socket]:
        return [status for _, status in self.by_pidfd.values()]

    def end(self, pidfd: int) -> None:
        pid, status = self.by_pidfd.pop(pidfd)
        os.close(pidfd)
        _, code = os.waitpid(pid, 0)
        _send(status, f"status {os.waitstatus_to_exitcode(code)}")
        status.close()


def _send(sock: socket.socket, text: str) -> None:
    try:
        sock.sendall(text.encode())
    except OSError:  # the parent gave up on this run
        pass


def _start_run(sock: socket.socket, runs: _Runs, message: bytes, fds: list[int], address: tuple[int, int]) -> str | None:
    """Fork the requested run; in the fork, return the module it runs."""
    request = json.loads(message)
    status, run_fds = socket.socket(fileno=fds[0]), fds[1:]
    # The pid goes back only once the fork leads its own session: a kill of its process
    # group (the budget's) must never miss it, as `start_new_session` guarantees.
    settled, settle = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(settled)
        return _become_run(request, run_fds, [sock, status, *runs.sockets()], list(runs.by_pidfd), settle, address)
    os.close(settle)
    for fd in run_fds:
        os.close(fd)
    failed = os.read(settled, 1)  # end of file: in its session and retagged; b"!": it could not be
    os.close(settled)
    if failed:
        os.waitpid(pid, 0)
        _send(status, "failed")
        status.close()
        return None
    runs.by_pidfd[os.pidfd_open(pid)] = (pid, status)
    _send(status, f"pid {pid}")
    return None


def _can_wait_on_pids() -> bool:
    """Whether this kernel gives pid descriptors (Linux 5.3+), which the run loop waits on."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def serve(sock: socket.socket, *, imported: bool = False, address: tuple[int, int] | None = None, extra: list[str] | None = None) -> str | None:
    """Fork one process per request; in the fork, return the module it runs. `imported`: this
    process is a fork of an interpreter that did the imports, at the tag `address`; `extra`:
    what it imports besides torch and the harness."""
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # a stack-dump request to the group is not for us
    address = address or _tag_address()
    if address is None or not _can_wait_on_pids() or not (imported or _preload(extra or [])):
        sock.sendall(b"unusable")
        return None
    sock.sendall(b"ready")
    runs = _Runs()
    while True:
        readable, _, _ = select.select([sock.fileno(), *runs.by_pidfd], [], [])
        for fd in readable:
            if fd != sock.fileno():
                runs.end(fd)
                continue
            try:
                message, fds, _flags, _address = socket.recv_fds(sock, _MAX_MESSAGE, _MAX_FDS)
            except OSError:
                return None
            if not message:
                return None
            module = _start_run(sock, runs, message, fds, address)
            if module is not None:
                return module


def main() -> None:
    sock = socket.socket(fileno=int(sys.argv[1]))
    module = serve(sock, extra=sys.argv[2:])
    if module is None:
        return
    sys.argv = [module]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
