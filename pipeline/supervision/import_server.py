"""An interpreter that imports torch once and hands every gate run on this machine that asks a
fork of itself as that run's agents' host (`warm.AgentHost`): for a queue of gate runs (a CI
runner's, this project's test suite's) the 2-4 CPU-seconds of `import torch` and
`torch._dynamo` are paid once instead of once per run.

    start(socket_path, gate_env, device)    # from the process that will start the gate runs
    TRAINGATE_IMPORT_SERVER=<socket path>   # in the gate runs' environment

A gate run whose agents' host would have started with exactly the environment the server's
imports ran with (`host_environment`) asks it for a fork (`request_host`), which then becomes
what `python -c <bootstrap> <socket> [pytest]` would have been: the run's descriptors, folder,
environment, run tag (written into the environment block `/proc/<pid>/environ` shows, in the
space the server reserved at `SLOT_ENV`), `sys.path` and module run as `__main__`; none of the
server's own modules (nor pytest, unless the run preloads it) left in `sys.modules`. Any other
environment, a server that is gone, busy or refuses, and the run starts its host afresh as
without one. The server never runs target code: its forks do, after they have become the host.

Lifetime: each fork is a subreaper and leads a session of its own; when the run closes its
connection (or dies, which closes it), the server kills the fork and everything below it, and
answers `closed` once they are gone. The server is a subreaper too (a host that dies hands its
children to it) and, when its parent dies or it is told to stop, kills everything below it.
Requests are taken only from the server's parent, the parent's children (the gate runs it
starts), the forks of its gate server and the children of its hosts (stage agents, asking for
the warm interpreters of their runs), by the peer credentials of the connection. Linux only, as
the warm start.

Before its imports, the server starts the servers beside it: its gate server
(`pipeline/gate/gate_server.py`: the `traingate` command itself, run as a fork of an interpreter
that imported the command line once) and a sibling for each other hash seed the stages' runs
use (`SIBLING_HASH_SEEDS`), which serves the same requests with that seed. They die with it.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingate.pipeline.supervision.processes import KEPT, ProcessInfo, kill, kill_descendants, process_table, read_process, reap
from traingate.stages.common.collector import collector_paused
from traingate.stages.common.inherited import agents_preload_arg
from traingate.stages.common.procstat import environment_entry, overwrite_environment

SERVER_ENV = "TRAINGATE_IMPORT_SERVER"
# The gate server this server starts (`pipeline/gate/gate_server.py`), named, not imported: the
# gate's process is above process supervision.
GATE_SERVER = "traingate.pipeline.gate.gate_server"
GATE_SUFFIX = ".gate"  # its socket: this server's, with this after it
# The hash seeds other than its own that the server keeps an interpreter of their own for, each
# at `<socket>.hashseed-<seed>` (a hash seed is fixed when an interpreter starts): the
# concurrency stage's determinism rerun runs with PYTHONHASHSEED=1 (`_rerun_hash_seed(1)` in
# stages/concurrency/stage.py; tests/pipeline/supervision/test_import_server.py checks the two agree).
SIBLING_HASH_SEEDS = ("1",)
# This module's name, also where it runs as `__main__` (a server starting its siblings).
_MODULE = __spec__.name if __spec__ is not None else __name__
_SIBLING = "--sibling"
# Bytes of the server's environment block set aside for each fork's run tag: the fork writes
# `<tag variable>=<tag>` over them, as a fresh host is started with its tag in its environment.
SLOT_ENV = "TRAINGATE_ENV_SLOT"
SLOT_WIDTH = 480
_MAX_MESSAGE = 1 << 20
_MAX_FDS = 3  # the host's socket, stdout, stderr
_REPLY_TIMEOUT_S = 30.0
_CLOSE_TIMEOUT_S = 15.0
PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
# What a fresh host's imports are (`stages/harness/fork_server.py`); pytest only when preloaded.
_IMPORTS = ("torch", "torch._dynamo")
_PRELOADABLE = ("pytest",)
# What a gate run's agents' host prepares for the stage agents it forks (`stages/agent/preload.py`),
# named to its fork server in hexadecimal, as the agents' own modules are named: a target's
# process forked there shows the host's command line as its own. The server prepares it once
# for all its hosts, and a host that asks for it keeps the gate's modules the server imported.
AGENTS_PRELOAD_MODULE = "traingate.stages.agent.preload"
AGENTS_PRELOAD = agents_preload_arg(AGENTS_PRELOAD_MODULE)
# How the server starts: without the current folder on sys.path, as a fresh host's `-c` does not
# keep it either (its bootstrap replaces it with the folder of the run's copy of the child side),
# and with its module's name in hexadecimal: its forks, the target's processes among them, show
# its command line as their own (a fresh host's names only the run's copy, `disguise.py`).
_BOOTSTRAP = "import sys, runpy; sys.path.pop(0); runpy.run_module(bytes.fromhex({module!r}).decode(), run_name='__main__', alter_sys=True)"


def host_environment(gate_env: Mapping[str, str], device: str) -> dict[str, str]:
    """The environment a gate run started with `gate_env` gives its agents' host on `device`
    (`orchestrator.agent_host`): what the server must import with to serve it."""
    # Imported here: `isolation` imports `warm`, which imports this module.
    from traingate.pipeline.supervision.isolation import child_environment
    from traingate.pipeline.supervision.target_env import target_env

    return target_env(child_environment(dict(gate_env)), device)


def start(socket_path: Path, gate_env: Mapping[str, str], device: str) -> subprocess.Popen[bytes]:
    """Start a server at `socket_path` for gate runs started with `gate_env` on `device`, with
    the servers beside it (its gate server, its siblings); their output goes to files beside the
    socket. Ready, all of them, when the socket exists (`wait_ready`)."""
    env = {**host_environment(gate_env, device), SLOT_ENV: " " * SLOT_WIDTH}
    folder = socket_path.parent
    with open(folder / "import-server.stdout", "wb") as out, open(folder / "import-server.stderr", "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP.format(module=_MODULE.encode().hex()), str(socket_path)],
            env=env, cwd=folder, stdin=subprocess.PIPE, stdout=out, stderr=err,
        )
    assert process.stdin is not None
    with process.stdin:  # the gate server's environment: the gate runs'
        process.stdin.write(json.dumps(dict(gate_env)).encode())
    KEPT.add(process.pid)  # this process's sweeps for leftovers leave it alone
    return process


def sibling_socket(socket_path: str, hash_seed: str) -> str:
    return f"{socket_path}.hashseed-{hash_seed}"


def _start_siblings(socket_path: str, import_env: dict[str, str]) -> dict[str, int]:
    """An import server of its own for each of SIBLING_HASH_SEEDS this one does not have, with
    this one's environment but its hash seed; the pid of each, by its socket."""
    started = {}
    for seed in SIBLING_HASH_SEEDS:
        if seed == import_env.get("PYTHONHASHSEED"):
            continue
        path = sibling_socket(socket_path, seed)
        # Its own files: its imports are silent when they print nothing (`_import_all`).
        with open(f"{path}.stdout", "wb") as out, open(f"{path}.stderr", "wb") as err:
            process = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP.format(module=_MODULE.encode().hex()), path, _SIBLING, str(os.getpid())],
                env={**import_env, "PYTHONHASHSEED": seed, SLOT_ENV: " " * SLOT_WIDTH}, cwd=os.getcwd(), stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            )
        started[path] = process.pid
    return started


def _await_socket(path: str, pid: int, timeout_s: float = 120.0) -> None:
    """Until the server `pid` answers at `path`, or has ended (then what it would serve is
    started afresh)."""
    deadline = time.monotonic() + timeout_s
    while not os.path.exists(path) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        time.sleep(0.02)


def _start_gate_server(socket_path: str, gate_env: dict[str, str]) -> int:
    """The gate server, an interpreter of its own with the gate runs' environment, serving the
    children of this server's parent; its pid."""
    module = GATE_SERVER.encode().hex()
    folder = Path(socket_path).parent
    with open(folder / "gate-server.stdout", "wb") as out, open(folder / "gate-server.stderr", "wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-c", _BOOTSTRAP.format(module=module), socket_path, str(os.getppid()), str(os.getpid())],
            env=gate_env, cwd=folder, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
        )
    return process.pid


def wait_ready(socket_path: Path, process: subprocess.Popen[bytes], timeout_s: float = 120.0) -> bool:
    """Whether the server `start` started is answering at `socket_path` within `timeout_s` (its
    imports done). A gate run needs no wait: until then it starts its host afresh."""
    deadline = time.monotonic() + timeout_s
    while not socket_path.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def residents(server_pid: int, table: Mapping[int, ProcessInfo] | None = None) -> set[int]:
    """The server and the servers beside it (its gate server, its siblings): what runs below it
    for its whole life. (Every fork they serve, host or command, leads a session of its own;
    they stay in the server's.) From `table` where given, else from a scan of its own."""
    table = process_table(cmdlines=False) if table is None else table
    server = table.get(server_pid)
    if server is None:
        return set()
    return {server_pid} | {p.pid for p in table.values() if p.ppid == server_pid and p.sid == server.sid}


def stop(process: subprocess.Popen[bytes]) -> None:
    """End a server `start` started, and everything below it: the servers beside it too, by
    their pids taken before, whatever state the server was in (they would die with it, but not
    before this returns)."""
    beside = [pid for pid in residents(process.pid) if pid != process.pid]
    process.terminate()
    process.wait()
    KEPT.discard(process.pid)
    kill(beside)
    deadline = time.monotonic() + 5.0
    while any((info := read_process(pid, cmdline=False)) is not None and info.alive for pid in beside) and time.monotonic() < deadline:
        reap(beside)  # this process's, where it is their subreaper
        time.sleep(0.01)


# ---------------------------------------------------------------------------------------------
# The gate run's side


@dataclass
class ServedHost:
    """The parts of `subprocess.Popen` a warm interpreter uses, for a host the server forked:
    killing it asks the server, which kills everything below it too and answers once they
    are gone."""

    pid: int
    connection: socket.socket
    returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, 0)
                return None
            self.returncode = -9
        return self.returncode

    def kill(self) -> None:
        """The host and every process below it, killed by the server; closing the connection
        would do it too, but not wait for it."""
        if self.returncode is not None:
            return
        with contextlib.suppress(OSError):
            self.connection.settimeout(_CLOSE_TIMEOUT_S)
            self.connection.sendall(b"close")
            self.connection.recv(64)
        self.connection.close()
        self.returncode = -9

    def wait(self) -> int:
        self.kill()
        return -9


def request_host(
    env: dict[str, str], tag_name: str, tag: str, cwd: Path, module: str, folder: str | None, args: list[str], out: int, err: int,
) -> tuple[socket.socket, ServedHost] | None:
    """A host forked by the server this run's environment names, running `module` (from
    `folder`, the run's copy of the child side, when given) with `args` after its socket's
    number, in `cwd`, with `env` (without its tag) and the tag `tag_name`=`tag`: this end of its
    socket and the host; None when there is no server, or it does not serve this run."""
    path = os.environ.get(SERVER_ENV)
    if not path or not sys.platform.startswith("linux"):
        return None
    sibling = sibling_socket(path, env.get("PYTHONHASHSEED", ""))
    if os.path.exists(sibling):
        path = sibling
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    request = {"env": env, "tag_name": tag_name, "tag": tag, "cwd": str(cwd), "module": module, "folder": folder, "args": args}
    try:
        connection.settimeout(_REPLY_TIMEOUT_S)
        connection.connect(path)
        socket.send_fds(connection, [json.dumps(request).encode()], [child_end.fileno(), out, err])
        reply = connection.recv(64)
    except OSError:
        reply = b""
    finally:
        child_end.close()
    if not reply.startswith(b"pid "):
        connection.close()
        parent_end.close()
        return None
    return parent_end, ServedHost(int(reply.split()[1]), connection)


# ---------------------------------------------------------------------------------------------
# The server's side


@dataclass
class _Imports:
    """What the server imported, and whether that was silent (a fresh host whose imports warn
    or print is unusable, and its runs start fresh: then so are this server's)."""

    silent: bool
    pytest_modules: frozenset[str]  # what importing pytest added: left out of a host that does not preload it


@dataclass
class _Server:
    listener: socket.socket
    imports: _Imports
    import_env: dict[str, str]
    slot: tuple[int, int] | None  # where SLOT_ENV's entry lies in the environment block, its length
    gate_server: int | None  # the pid of its gate server (`pipeline/gate/gate_server.py`), whose forks ask for hosts
    trusted_parent: int  # the process that started the import server (a sibling's grandparent)
    hosts_of: int  # the import server whose hosts' children (stage agents) may ask too
    hosts: dict[int, int] = field(default_factory=dict)  # connection fd -> the host it was given
    connections: dict[int, socket.socket] = field(default_factory=dict)


@dataclass(frozen=True)
class _Become:
    """What a fork runs once it is the host."""

    module: str
    argv: list[str]


def _import_all() -> _Imports:
    """torch, torch._dynamo, pytest and what the stage agents prepare (`AGENTS_PRELOAD_MODULE`),
    with the collector paused and what they made set aside (as `fork_server` does, for the same
    reasons)."""
    with collector_paused(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for name in _IMPORTS:
                __import__(name)
            with_torch = frozenset(sys.modules)
            for name in _PRELOADABLE:
                __import__(name)
            pytest_modules = frozenset(sys.modules) - with_torch
            importlib.import_module(AGENTS_PRELOAD_MODULE).prepare(every_stage=True)
        except BaseException:  # noqa: BLE001 - the environment may have anything installed
            return _Imports(False, frozenset())
    silent = not caught and os.fstat(1).st_size == 0 and os.fstat(2).st_size == 0
    return _Imports(silent, pytest_modules)


def die_with(parent: int) -> None:
    """End with `parent` (SIGTERM when it dies), and now if it is gone already: a server its
    parent stopped before this one was up must not outlive it."""
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(0)


def prctl(option: int, value: int) -> None:
    """`prctl(2)`, where there is one (also the gate server's)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def peer_is_trusted(connection: socket.socket, parent: int, forks_of: int | None = None, hosts_of: int | None = None) -> bool:
    """The connecting process is `parent`, one of its children, (`forks_of`) one of that
    server's forks, or (`hosts_of`) a child of one of the hosts that import server forked (a
    stage agent), and of this user."""
    raw = connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12)
    pid, uid = int.from_bytes(raw[0:4], sys.byteorder), int.from_bytes(raw[4:8], sys.byteorder)
    peer = read_process(pid, cmdline=False)
    if uid != os.getuid() or peer is None:
        return False
    if pid == parent or peer.ppid in (parent, forks_of):
        return True
    host = read_process(peer.ppid, cmdline=False) if hosts_of is not None else None
    # A host leads a session of its own; the servers beside the import server, its other children, do not.
    return host is not None and host.ppid == hosts_of and host.sid == host.pid


def _kill_below(pid: int) -> None:
    """`pid` and everything below it, killed and reaped (this server reaps its own)."""
    kill_descendants(pid)
    kill([pid])
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # dead before the run is told so
    _reap_children()


def _reap_children() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _answer(connection: socket.socket, text: str) -> None:
    with contextlib.suppress(OSError):
        connection.sendall(text.encode())


def _end_connection(server: _Server, fd: int, *, answer: bool) -> None:
    connection = server.connections.pop(fd)
    host = server.hosts.pop(fd, None)
    if host is not None:
        _kill_below(host)
    if answer:
        _answer(connection, "closed")
    connection.close()


def _serve_one(server: _Server, fd: int) -> _Become | None:
    """Read one message of a connection: a host's request (then fork it; in the fork, return
    what it runs), or its end."""
    connection = server.connections[fd]
    try:
        message, fds, _flags, _address = socket.recv_fds(connection, _MAX_MESSAGE, _MAX_FDS)
    except OSError:
        message, fds = b"", []
    if fd in server.hosts or not message or len(fds) != _MAX_FDS:
        for received in fds:
            os.close(received)
        _end_connection(server, fd, answer=message == b"close")
        return None
    request = json.loads(message)
    if server.slot is None or not server.imports.silent or request["env"] != server.import_env:
        differ = sorted(k for k in {*request["env"], *server.import_env} if request["env"].get(k) != server.import_env.get(k))
        print(f"refused: imports silent {server.imports.silent}; variables that differ: {differ}", file=sys.stderr, flush=True)
        for received in fds:
            os.close(received)
        _answer(connection, "refused")
        return None
    return _fork_host(server, fd, request, fds)


def fork_handing_over(fds: list[int]) -> int:
    """`os.fork()`, after flushing this process's output; the parent closes `fds`, which the
    request handed over for the fork alone. (Also the gate server's.)"""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        for received in fds:
            os.close(received)
    return pid


def _fork_host(server: _Server, fd: int, request: dict[str, Any], fds: list[int]) -> _Become | None:
    pid = fork_handing_over(fds)
    if pid == 0:
        return _become_host(server, request, fds)
    server.hosts[fd] = pid
    _answer(server.connections[fd], f"pid {pid}")
    return None


def _become_host(server: _Server, request: dict[str, Any], fds: list[int]) -> _Become:
    """In the fork: the host's session, descriptors, folder, environment, tag and modules."""
    os.setsid()
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    prctl(PR_SET_PDEATHSIG, 0)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    # Nothing of the server's reaches the host: its sockets are detached first, so that no
    # socket object closes a number the host reuses later.
    for held in [server.listener, *server.connections.values()]:
        os.close(held.detach())
    host_socket, out, err = fds
    null = os.open(os.devnull, os.O_RDONLY)
    for source, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(source, target)
        os.close(source)
    assert server.slot is not None  # a server without it refuses every request
    if not overwrite_environment(server.slot, f"{request['tag_name']}={request['tag']}".encode()):
        os._exit(70)  # its socket closes unready: the gate run's runs start fresh
    os.environ.clear()
    os.environ.update({**request["env"], request["tag_name"]: request["tag"]})
    os.chdir(request["cwd"])
    _forget_modules(server.imports, preload=set(request["args"]))
    if request["folder"] is not None:
        sys.path.insert(0, str(request["folder"]))
    return _Become(str(request["module"]), ["-c", str(host_socket), *request["args"]])


def _forget_modules(imports: _Imports, preload: set[str]) -> None:
    """Leave in `sys.modules` what a fresh host would have before its own code: not the
    server's modules (unless the host prepares the stage agents it forks: `AGENTS_PRELOAD`), not
    the editable install's finders (the bootstrap drops them), not pytest unless the run
    preloads it."""
    pytest_too = frozenset() if "pytest" in preload else imports.pytest_modules
    gate = ("__editable__",) if AGENTS_PRELOAD in preload else ("traingate", "__editable__")
    for name in list(sys.modules):
        if name.startswith(gate) or name in pytest_too:
            del sys.modules[name]


@contextlib.contextmanager
def _stopping() -> Iterator[None]:
    """SIGTERM and the parent's death end the server, and everything below it with it (not in
    a fork leaving the loop to become a host)."""
    server_pid = os.getpid()

    def stop(_signum: int, _frame: object) -> None:
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, stop)
    prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        yield
    finally:
        if os.getpid() == server_pid:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            kill_descendants()


def serve(server: _Server) -> _Become | None:
    """Answer connections until stopped; in a fork, return what it runs."""
    while True:
        readable, _, _ = select.select([server.listener, *server.connections.values()], [], [], 1.0)
        _reap_children()
        for ready in readable:
            if ready is server.listener:
                connection, _address = server.listener.accept()
                # The server's parent, its children (gate runs), the gate server's forks, the hosts' agents.
                if peer_is_trusted(connection, server.trusted_parent, server.gate_server, server.hosts_of):
                    server.connections[connection.fileno()] = connection
                else:
                    connection.close()
                continue
            become = _serve_one(server, ready.fileno())
            if become is not None:
                return become


def main() -> None:
    slot = environment_entry(SLOT_ENV)
    import_env = {k: v for k, v in os.environ.items() if k != SLOT_ENV}
    os.environ.pop(SLOT_ENV, None)  # the imports see the hosts' environment, as a fresh host's do
    if sys.argv[2:3] == [_SIBLING]:
        # Started by the import server, for another hash seed: its parent's hosts, its grandparent's runs.
        die_with(int(sys.argv[3]))
        parent = read_process(os.getppid(), cmdline=False)
        gates, started, trusted_parent, hosts_of = None, {}, parent.ppid if parent else -1, os.getppid()
    else:
        # Started before torch is imported here: the gate server with the environment `start`
        # was given, and the other hash seeds' servers.
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        gates = _start_gate_server(sys.argv[1], json.loads(sys.stdin.read()))
        started = {sys.argv[1] + GATE_SUFFIX: gates, **_start_siblings(sys.argv[1], import_env)}
        trusted_parent, hosts_of = os.getppid(), os.getpid()
    imports = _import_all()
    for path, pid in started.items():  # ready (the socket `wait_ready` waits for) means all of them
        _await_socket(path, pid)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(sys.argv[1])
    listener.listen(16)
    become = None
    with _stopping():
        become = serve(_Server(listener, imports, import_env, slot, gates, trusted_parent, hosts_of))
    if become is None:
        return
    # The fork, now the host: run as `python -c` would have run it.
    sys.argv = become.argv
    import runpy

    runpy.run_module(become.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
