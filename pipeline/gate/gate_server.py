"""The gate's own processes forked from an interpreter that imported the command line once: the
import server's second half (`pipeline/supervision/import_server.py`), for a queue of gate runs on one machine.

    TRAINGATE_IMPORT_SERVER=<socket path>   # as for the agents' hosts; this server is at <path>.gate

The import server starts it, before its own imports, as an interpreter of its own with the gate
runs' environment (the import server's is the hosts'), which never imports torch (a gate's
process never does: `pipeline/gate/torch_probe.py`). It imports the command line and the
installed stages' declarations (most of a `traingate` process's own second of CPU), then answers:
`traingate` whose environment names an import server asks it first (`run_served`, from
`pipeline/gate/launch.py`, which imports nothing else before). The command's descriptors 0-2,
folder, environment and arguments go over the socket; a fork becomes that command's process (a
session of its own) and runs it; its exit status comes back, and the command exits with it.
SIGINT, SIGTERM and SIGHUP the command gets are passed on to the fork, so an interrupted run
stops as it would have (`pipeline/supervision/lifecycle.py`). A command whose environment differs
from the server's in what an interpreter reads as it starts (`_read_at_start`: PYTHONPATH and
the like), or whose server is gone, silent or refusing, runs in its own process, as without one.

Lifetime: a command that dies (killed) closes its connection by dying, and the server kills its
fork and everything below it; a fork that ends has what is left of its session killed. The
server is a subreaper and dies with the import server. Requests are taken only from the import
server's parent and that process's children, by the peer credentials of the connection, as the
import server's. Linux only.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import sys
import traceback
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

from traingate.pipeline.supervision.import_server import (
    GATE_SUFFIX,
    PR_SET_CHILD_SUBREAPER,
    PR_SET_PDEATHSIG,
    SERVER_ENV,
    die_with,
    fork_handing_over,
    peer_is_trusted,
    prctl,
)
from traingate.pipeline.supervision.processes import kill, kill_descendants, process_table
from traingate.stages.common.collector import collector_paused

_MAX_MESSAGE = 1 << 20
_FDS = 3  # the command's stdin, stdout and stderr
_REPLY_TIMEOUT_S = 30.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def socket_path(import_socket: str) -> str:
    return import_socket + GATE_SUFFIX


# ---------------------------------------------------------------------------------------------
# The command's side: nothing of the gate is imported yet


def run_served(argv0: str, argv: list[str]) -> int | None:
    """`traingate ARGV` run by the gate server this process's environment names: its exit
    status; None when there is no server, it does not serve, or it ended before the command did
    (then run the command here)."""
    path = os.environ.get(SERVER_ENV)
    if not path or not sys.platform.startswith("linux"):
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = {"argv0": argv0, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}
    try:
        connection.settimeout(_REPLY_TIMEOUT_S)
        connection.connect(socket_path(path))
        socket.send_fds(connection, [json.dumps(request).encode()], [0, 1, 2])
        reply = connection.recv(64)
    except OSError:
        reply = b""
    if not reply.startswith(b"pid "):
        connection.close()
        return None
    connection.settimeout(None)

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(OSError):
            connection.sendall(f"signal {signum}".encode())

    before = {signum: signal.signal(signum, forward) for signum in _FORWARDED}
    try:
        message = connection.recv(64)
    except OSError:
        message = b""
    if not message.startswith(b"exit "):
        # The server ended first, and its fork with it: the run starts again here, so that its
        # verdict is still written.
        for signum, handler in before.items():
            signal.signal(signum, handler)
        print("traingate: the import server ended before this run did; running it again in this process", file=sys.stderr)
        return None
    status = int(message.split()[1])
    if status < 0:  # killed by a signal: so is this process, as a caller of a fresh one would see
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


# ---------------------------------------------------------------------------------------------
# The server's side


@dataclass
class _Gates:
    listener: socket.socket
    trusted_parent: int
    started_with: dict[str, str]  # `_read_at_start` of this server's own environment
    woken: int  # the pipe SIGCHLD writes to (`signal.set_wakeup_fd`): a command's end wakes the loop
    wake: int
    connections: dict[int, socket.socket] = field(default_factory=dict)
    forks: dict[int, int] = field(default_factory=dict)  # connection fd -> the command's process


@dataclass(frozen=True)
class Command:
    """What a fork runs once it is the command's process."""

    argv0: str
    argv: list[str]


def main() -> None:
    """The gate server, started by the import server (`import_server.start`) with the gate runs'
    environment: `<import socket> <pid whose children it serves> <the import server's pid>`.
    In a fork that became a command's process, the command's exit status is raised
    (`SystemExit`), so that the process ends as a fresh one would, its exit handlers run."""
    import_socket, trusted_parent = sys.argv[1], int(sys.argv[2])
    die_with(int(sys.argv[3]))  # the import server
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    started_with = _read_at_start(os.environ)
    command = _serve(import_socket, trusted_parent, started_with) if _imports() else None
    if command is None:
        return
    sys.argv = [command.argv0, *command.argv]
    from traingate.pipeline.gate.cli import main as run_command

    raise SystemExit(run_command(command.argv))


def _imports() -> bool:
    """The command line, the installed stages' declarations and the report templates, loaded
    once; whether that was silent (else a fresh process would print what a fork would not).
    What they made is set aside from the collector (`collector_paused`, as the import server
    does): a full collection in each fork would otherwise walk all of it, about 30 ms a run."""
    with collector_paused(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            from traingate.pipeline.gate import cli  # noqa: F401
            from traingate.pipeline.gate.outputs import stage_pages
            from traingate.pipeline.model.registry import build_deferred_models, build_registry
            from traingate.reports.render import load_templates

            build_registry()
            build_deferred_models()  # the stages' details, read as the reports are written
            load_templates(stage_pages().values())
        except Exception:  # noqa: BLE001 - then no command is served: each runs as without a server
            traceback.print_exc()
            return False
    return not caught and os.fstat(1).st_size == 0 and os.fstat(2).st_size == 0


def _read_at_start(env: Mapping[str, str]) -> dict[str, str]:
    """What of an environment an interpreter reads as it starts (sys.path, site, its flags,
    the encoding of its streams): a command whose environment differs in any of it would not
    run as a fork of this server as it would in a fresh process (a PYTHONPATH naming a
    plugin's stages, for one)."""
    return {k: v for k, v in env.items() if k.startswith("PYTHON") or k in ("LANG", "LC_ALL", "LC_CTYPE")}


def _serve(import_socket: str, trusted_parent: int, started_with: dict[str, str]) -> Command | None:
    """Answer commands until stopped; in a fork, return the command it runs."""
    server_pid = os.getpid()

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(socket_path(import_socket))
    listener.listen(16)
    woken, wake = os.pipe()
    os.set_blocking(wake, False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake)
    gates = _Gates(listener, trusted_parent, started_with, woken, wake)
    try:
        while True:
            readable, _, _ = select.select([listener.fileno(), woken, *gates.connections], [], [], 1.0)
            _reap(gates)
            for ready in readable:
                if ready == woken:
                    os.read(woken, 512)
                elif ready == listener.fileno():
                    _accept(gates)
                elif ready in gates.connections:  # not one `_reap` just closed
                    command = _serve_one(gates, ready)
                    if command is not None:
                        return command
    finally:
        if os.getpid() == server_pid:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            kill_descendants()


def _accept(gates: _Gates) -> None:
    connection, _address = gates.listener.accept()
    if peer_is_trusted(connection, gates.trusted_parent):
        gates.connections[connection.fileno()] = connection
    else:
        connection.close()


def _serve_one(gates: _Gates, fd: int) -> Command | None:
    """One message of a connection: a command (fork it; in the fork, return it), a signal for
    its process, or the connection's end (its command's process is killed)."""
    connection = gates.connections[fd]
    try:
        message, fds, _flags, _address = socket.recv_fds(connection, _MAX_MESSAGE, _FDS)
    except OSError:
        message, fds = b"", []
    pid = gates.forks.get(fd)
    if pid is not None or not message or len(fds) != _FDS:
        for received in fds:
            os.close(received)
        if pid is not None and message.startswith(b"signal "):
            with contextlib.suppress(OSError, ValueError):
                os.kill(pid, int(message.split()[1]))
            return None
        _end(gates, fd)
        return None
    request = json.loads(message)
    if _read_at_start(request["env"]) != gates.started_with:
        for received in fds:
            os.close(received)
        _end(gates, fd, refused=True)
        return None
    pid = fork_handing_over(fds)
    if pid == 0:
        return _become_command(gates, request, fds)
    gates.forks[fd] = pid
    with contextlib.suppress(OSError):
        connection.sendall(f"pid {pid}".encode())
    return None


def _become_command(gates: _Gates, request: dict[str, object], fds: list[int]) -> Command:
    """In the fork: the command's session, descriptors, folder and environment."""
    os.setsid()
    prctl(PR_SET_CHILD_SUBREAPER, 0)
    prctl(PR_SET_PDEATHSIG, 0)
    signal.set_wakeup_fd(-1)
    for signum in (*_FORWARDED, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    for held in [gates.listener, *gates.connections.values()]:
        os.close(held.detach())
    os.close(gates.woken)
    os.close(gates.wake)
    for source, target in zip(fds, (0, 1, 2), strict=True):
        os.dup2(source, target)
        os.close(source)
    # Line-buffered where the command's output is a terminal, as a fresh process's would be.
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, OSError, ValueError):
            stream.reconfigure(line_buffering=stream.isatty() or stream is sys.stderr)  # type: ignore[union-attr]
    env = request["env"]
    assert isinstance(env, dict)
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in env.items()})
    os.chdir(str(request["cwd"]))
    argv = request["argv"]
    assert isinstance(argv, list)
    return Command(str(request["argv0"]), [str(a) for a in argv])


def _end(gates: _Gates, fd: int, status: int | None = None, refused: bool = False) -> None:
    """Close a connection: with its command's exit status when it ended, refusing its command,
    else (the command died) after killing its process and what is below it."""
    connection = gates.connections.pop(fd)
    pid = gates.forks.pop(fd, None)
    if pid is not None and status is None:
        kill_descendants(pid)
        kill([pid])
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
    if pid is not None:
        _kill_session(pid)
    if status is not None or refused:
        with contextlib.suppress(OSError):
            connection.sendall(b"refused" if refused else f"exit {status}".encode())
    connection.close()


def _kill_session(sid: int) -> None:
    """What is left of a command's session once its process has ended (its orphans are this
    server's then)."""
    kill([p.pid for p in process_table(cmdlines=False).values() if p.sid == sid])


def _reap(gates: _Gates) -> None:
    """Collect every ended child (commands' orphans come here too) and answer for the commands."""
    by_pid = {pid: fd for fd, pid in gates.forks.items()}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = by_pid.get(pid)
        if fd is not None:
            _end(gates, fd, os.waitstatus_to_exitcode(status))


if __name__ == "__main__":
    main()
