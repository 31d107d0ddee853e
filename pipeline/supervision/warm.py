"""The parent side of a warm interpreter (`traingate.stages.harness.fork_server`): start it once per
environment, then launch each child run as a fork of it that behaves, for `run_child`, like the
process `subprocess.Popen` would have started.

What stays as with a fresh interpreter: the child leads a session of its own (its pid is its
process group, which the budget's kill and the stack dumps address), has the run's stdin,
stdout, stderr and channel on the same numbers, the run's environment and folder, and its run
tag in the environment block `/proc/<pid>/environ` shows (written over the interpreter's own,
which is reserved at `TAG_WIDTH` bytes), and its orphans come back to this process, a child
subreaper. What differs: its parent is the warm interpreter (which reaps it and reports its exit
code on a socket of the run's own), and torch was imported before the run began, with the same
environment.

A warm interpreter serves any number of runs at once, but only runs whose environment equals its
own (but the run's own tag and stack file) and, where PYTHONPATH names folders relative to it,
whose folder does too; anything else, or one that died or never
got ready, falls back to a fresh interpreter. The one exception is the gate run's `AgentHost`:
it imports with the environment of the target's runs and serves the stage agents, whose own
environment differs, each a fork that keeps a fork of its own for the agent's runs. Linux, Python 3.11+; `TRAINGATE_WARM_START=0`
turns it off.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from traingate.pipeline.supervision.import_server import AGENTS_PRELOAD, ServedHost, request_host
from traingate.pipeline.supervision.processes import kill, kill_group
from traingate.stages.common.inherited import InheritedWarm
from traingate.pipeline.supervision import disguise
from traingate.pipeline.supervision.disguise import Disguise

WARM_MODULE = "traingate.stages.harness.fork_server"
# How long the first launch waits for the interpreter's imports (a fresh child would spend
# the same time importing inside its own budget).
READY_TIMEOUT_S = 120.0
# A reply to a fork request that takes longer than this means the interpreter is wedged.
REPLY_TIMEOUT_S = 30.0
# Bytes reserved for a run tag in a warm interpreter's environment block; a run whose tag is
# longer starts fresh. Tags read back from /proc are stripped of the padding (`read_tag`).
TAG_WIDTH = 160
# What the warm interpreters of runs that each run a test as their entrypoint import besides
# torch: with no entrypoint configured, every run of the stages that observe training does.
TEST_RUN_IMPORTS = ("pytest",)


def read_tag(value: str) -> str:
    """A run tag as read from /proc/<pid>/environ, without the padding a fork's tag carries."""
    return value.rstrip(" ")


def enabled() -> bool:
    """Linux (fork and /proc) on Python 3.11+ (`-P`, as every child gets), unless turned off."""
    return sys.platform.startswith("linux") and sys.version_info >= (3, 11) and os.environ.get("TRAINGATE_WARM_START", "1") != "0"


class ForkedChild:
    """The few parts of `subprocess.Popen` that `run_child` uses, for a fork of a warm
    interpreter: its exit code arrives on the run's own status socket."""

    def __init__(self, pid: int, status: socket.socket, stdin: IO[bytes] | None, done: Callable[[bool], None]) -> None:
        self.pid = pid
        self.stdin = stdin
        self.returncode: int | None = None
        self._status = status
        self._done = done

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is not None:
            return self.returncode
        self._status.settimeout(timeout)
        try:
            reply = self._status.recv(256)
        except TimeoutError:
            raise subprocess.TimeoutExpired([str(self.pid)], timeout or 0.0) from None
        except OSError:
            reply = b""
        self._status.close()
        alive = reply.startswith(b"status ")
        if alive:
            self.returncode = int(reply.split()[1])
        else:
            # The warm interpreter died under its child (the target can kill its parent): the
            # child's status is lost, so the run ends as killed.
            kill_group(self.pid)
            self.returncode = -9
        self._done(alive)
        return self.returncode

    def poll(self) -> int | None:
        return self.returncode


class WarmInterpreter:
    """One warm interpreter for runs with this environment and folder: started here (`start`),
    or handed down to this process by the interpreter it was forked from (`adopt`)."""

    # Whether each fork gets a warm interpreter of its own (`AgentHost`).
    hands_down = False

    def __init__(
        self, env: dict[str, str], cwd: Path, sock: socket.socket, process: subprocess.Popen[bytes] | _OwnFork | ServedHost, mask: Disguise | None = None,
    ) -> None:
        # The run's copy of the child side this interpreter runs (`pipeline/supervision/disguise.py`): the
        # names of the variables that differ between runs are its.
        self.disguise = mask
        self.env = _shared(env, mask)
        self.cwd = cwd
        self._sock = sock
        self._proc = process
        self._lock = threading.Lock()  # one request on the socket at a time; readiness read once
        self._ready: bool | None = None
        self._waited_s = 0.0  # how long runs have waited for its imports, all together
        self._broken = False

    @classmethod
    def start(cls, env: dict[str, str], cwd: Path, scratch: Path, tag: str, mask: Disguise | None = None, preload: tuple[str, ...] = ()) -> WarmInterpreter:
        """A fork of the import server the environment names where one serves `env` (the
        concurrency stage's other hash seed has one of its own), else a fresh interpreter."""
        sock, process = _start_process(env, cwd, scratch, tag, mask, preload, served=True)
        return cls(env, cwd, sock, process, mask)

    @classmethod
    def adopt(cls, handed: InheritedWarm, mask: Disguise | None = None) -> WarmInterpreter:
        """The interpreter forked for this process before its code ran (a stage agent forked
        from an `AgentHost`): its child, with the host's imports and environment."""
        return cls(handed.env, Path(handed.cwd), socket.socket(fileno=handed.socket_fd), _OwnFork(handed.pid), mask)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def served(self) -> bool:
        """Forked by an import server, not below this process (`import_server.py`)."""
        return isinstance(self._proc, ServedHost)

    def accepts(self, env: dict[str, str], cwd: Path) -> bool:
        """Whether a run with this environment and folder would have started as this interpreter
        did. The folder only counts through PYTHONPATH: a relative entry (or an empty one) is
        made absolute against the folder an interpreter starts in; with `-P` nothing else is."""
        return _shared(env, self.disguise) == self.env and (cwd == self.cwd or not folder_dependent(self.env.get("PYTHONPATH")))

    def launch(
        self, module: str, env: dict[str, str], cwd: Path, out: IO[bytes], err: IO[bytes], *,
        stdin: bool, channel_fd: int | None, run_tag: str,
    ) -> ForkedChild | None:
        """Fork a child that runs `module` (its name in the process: the copy's for a child-side
        module); None when this interpreter cannot serve it."""
        if len(run_tag.encode()) > TAG_WIDTH or not self.wait_ready():
            return None
        with self._lock:
            try:
                child = None if self._broken else self._fork(module, env, cwd, out, err, stdin, channel_fd)
            except (OSError, ValueError):
                child = None
            self._broken = self._broken or child is None
        return child

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        """Whether the interpreter has done its imports and can fork, waiting up to `timeout_s`
        for them. One still importing then is left to later runs (a busy machine's imports
        finish, and a later stage has a budget of its own); one whose imports failed, or that
        is not ready after `READY_TIMEOUT_S` in all, is given up."""
        wait_s = max(min(timeout_s, READY_TIMEOUT_S - self._waited_s), 0.0)
        if not self._lock.acquire(timeout=wait_s):
            return False  # another run is still waiting for the imports, longer than this one may
        started = time.monotonic()
        try:
            if self._ready is None:
                self._ready = self._read_ready(wait_s)
                self._waited_s += time.monotonic() - started
                if self._ready is None and self._waited_s >= READY_TIMEOUT_S:
                    self._ready = False
                self._broken = self._broken or self._ready is False
            return bool(self._ready) and not self._broken
        finally:
            self._lock.release()

    def _read_ready(self, wait_s: float) -> bool | None:
        """The interpreter's word on its imports within `wait_s`; None: none yet."""
        try:
            if wait_s <= 0.0:
                self._sock.setblocking(False)
            else:
                self._sock.settimeout(wait_s)
            return self._sock.recv(64) == b"ready"
        except (TimeoutError, BlockingIOError):
            return None
        except OSError:
            return False
        finally:
            self._sock.settimeout(REPLY_TIMEOUT_S)  # the fork requests' sends block, as before

    def _fork(
        self, module: str, env: dict[str, str], cwd: Path, out: IO[bytes], err: IO[bytes],
        stdin: bool, channel_fd: int | None,
    ) -> ForkedChild | None:
        status, status_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, write_end = os.pipe() if stdin else (os.open(os.devnull, os.O_RDONLY), -1)
        fds = [status_end.fileno(), read_end, out.fileno(), err.fileno(), *([channel_fd] if channel_fd is not None else [])]
        request = {"module": module, "env": env, "cwd": str(cwd), "channel_fd": channel_fd, "hand_down": self.hands_down}
        reply = b""
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], fds)
            status.settimeout(REPLY_TIMEOUT_S)
            reply = status.recv(64)
        except OSError:
            pass
        finally:
            status_end.close()
            os.close(read_end)
            if write_end >= 0 and not reply.startswith(b"pid "):
                os.close(write_end)
        if not reply.startswith(b"pid "):
            status.close()
            return None
        status.settimeout(None)
        writer = os.fdopen(write_end, "wb") if write_end >= 0 else None
        return ForkedChild(int(reply.split()[1]), status, writer, self._finished)

    def _finished(self, alive: bool) -> None:
        self._broken = self._broken or not alive

    def close(self) -> None:
        self._sock.close()
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()


class AgentHost(WarmInterpreter):
    """The warm interpreter of a gate run's stage agents: torch imported once, with the
    environment the target's runs get (`target_env`), for every stage. Each agent is a fork of
    it, with the agent's own environment, and gets a fork of its own for its runs
    (`traingate.stages.common.inherited`), so no stage agent imports torch again for runs in
    that environment (the concurrency stage's other hash seed needs one of its own: a fresh one,
    or the import server's sibling of that seed). Where the gate's environment names an import
    server that serves this environment, the host is a fork of it instead, and not even the gate
    run imports torch (`import_server.py`). It also prepares, once, what every agent would
    import and build before its stage runs (`AGENTS_PRELOAD`: `stages/agent/preload.py`)."""

    hands_down = True

    def __init__(
        self, target_env: dict[str, str], agent_env: dict[str, str], cwd: Path, scratch: Path, tag: str, mask: Disguise | None = None,
        preload: tuple[str, ...] = (), *, served_only: bool = False,
    ) -> None:
        """`served_only`: only a fork of the import server, else `NotServed` is raised (where
        the host is worth a fork but not an interpreter's imports of its own)."""
        sock, process = _start_process(target_env, cwd, scratch, tag, mask, (*preload, AGENTS_PRELOAD), served=True, served_only=served_only)
        super().__init__(target_env, cwd, sock, process, mask)
        self.agent_env = _shared(agent_env, mask)

    def accepts(self, env: dict[str, str], cwd: Path) -> bool:
        """An agent's environment is the gate's own, never folder-dependent (`-P`)."""
        return _shared(env, self.disguise) == self.agent_env


class _OwnFork:
    """The parts of `subprocess.Popen` that `close` uses, for a child this process did not start
    with `subprocess` (a handed-down interpreter)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._code: int | None = None

    def poll(self) -> int | None:
        if self._code is None:
            self._reap(os.WNOHANG)
        return self._code

    def kill(self) -> None:
        kill([self.pid])

    def wait(self) -> int:
        while self._code is None:
            self._reap(0)
        return self._code

    def _reap(self, flags: int) -> None:
        try:
            pid, status = os.waitpid(self.pid, flags)
        except ChildProcessError:  # reaped already: its status is lost
            self._code = -9
            return
        if pid:
            self._code = os.waitstatus_to_exitcode(status)


class NotServed(Exception):
    """No import server serves this environment, and a fresh interpreter was not wanted."""


def _start_process(
    env: dict[str, str], cwd: Path, scratch: Path, tag: str, mask: Disguise | None, preload: tuple[str, ...] = (), *,
    served: bool = False, served_only: bool = False,
) -> tuple[socket.socket, subprocess.Popen[bytes] | ServedHost]:
    """A warm interpreter started with `env` (and the tag, padded) in `cwd`, from the run's copy
    of the child side when `mask` is given, importing `preload` too: this end of its socket, and
    the process. `served`: a fork of the import server the environment names, where it serves
    this environment (`import_server.py`), else a fresh interpreter, or `NotServed` with
    `served_only`."""
    scratch.mkdir(parents=True, exist_ok=True)
    # Its own files: it checks that its imports printed nothing.
    name = f"warm-{tag.rsplit(':', 1)[-1]}"
    with open(scratch / f"{name}.stdout", "wb") as out, open(scratch / f"{name}.stderr", "wb") as err:
        tag_name = disguise.tag_env(WARM_MODULE, mask)
        if served:
            module = mask.module(WARM_MODULE) if mask is not None else WARM_MODULE
            host = request_host(
                _shared(env, mask), tag_name, tag.ljust(TAG_WIDTH), cwd, module, mask.folder if mask is not None else None, list(preload),
                out.fileno(), err.fileno(),
            )
            if host is not None:
                return host
        if served_only:
            for unused in (out, err):
                os.unlink(unused.name)
            raise NotServed(WARM_MODULE)
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        process = subprocess.Popen(
            disguise.module_argv(WARM_MODULE, str(child_end.fileno()), *preload, disguise=mask),
            cwd=cwd, env={**_shared(env, mask), tag_name: tag.ljust(TAG_WIDTH)}, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            pass_fds=(child_end.fileno(),),
        )
    child_end.close()
    return parent_end, process


def _shared(env: dict[str, str], mask: Disguise | None) -> dict[str, str]:
    """An environment without what differs between runs (their tag and stack file)."""
    per_run = disguise.per_run_names(mask)
    return {k: v for k, v in env.items() if k not in per_run}


def folder_dependent(pythonpath: str | None) -> bool:
    """Whether PYTHONPATH has an entry (a relative or an empty one) that names the folder an
    interpreter starts in, or one below it."""
    return pythonpath is not None and any(not os.path.isabs(entry) for entry in pythonpath.split(os.pathsep))
