"""Run a child process in its own process group, under a wall budget.

On overrun every process of the group is asked to dump the stacks of all its threads
(faulthandler on SIGUSR1, installed by `traingate.stages.common.guard`), the state of each process is
read from /proc, and the whole group is killed, DataLoader workers included. After a normal
exit the group is killed too, so no orphaned worker outlives its run. Processes that left the
group (a double-forked `setsid` daemon) come back to this process, a child subreaper
(`traingate.pipeline.supervision.processes`), and are killed and reaped too; they are returned as the
child's `leftovers` for the stage to report.
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from traingate.pipeline.supervision.processes import ProcessInfo, environment_value, kill_descendants, kill_group, process_table
from traingate.pipeline.supervision.warm import ForkedChild, WarmInterpreter, read_tag
from traingate.pipeline.supervision import disguise, spawned
from traingate.pipeline.supervision.disguise import Disguise, module_argv

if TYPE_CHECKING:  # the pool starts its interpreters with this module's help
    from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.common.procstat import send_signal
from traingate.stages.common.stacks import Frame, main_thread_frames

# RUN_TAG_ENV names the run_child call a process descends from, read back from
# /proc/<pid>/environ to tell whose orphan a process is when several children run at once (a
# hint: a process may drop it). A fork of a warm interpreter shows its run's tag there too.
_DUMP_SIGNAL = signal.SIGUSR1


@dataclass(frozen=True)
class ChildResult:
    argv: list[str]
    returncode: int | None
    timed_out: bool
    duration_s: float
    stdout: str
    stderr: str
    stacks: str = ""
    processes: list[dict[str, str]] = field(default_factory=list)
    # Processes this child started that were still running after it ended although they had
    # left its process group (setsid/setpgid daemons): pid, ppid, pgid, sid, cmdline, escaped.
    leftovers: list[dict[str, Any]] = field(default_factory=list)
    # What the child wrote to its channel (run_child(channel=True)), and why it cannot be
    # trusted whole when it cannot (too large, or still held open after every process died).
    channel: bytes = b""
    channel_problem: str | None = None

    @property
    def signal_name(self) -> str | None:
        if self.returncode is not None and self.returncode < 0:
            try:
                return signal.Signals(-self.returncode).name
            except ValueError:
                return f"signal {-self.returncode}"
        return None

    def main_thread_frames(self) -> list[Frame]:
        """Frames of the main thread of the main process, innermost first."""
        return main_thread_frames(self.stacks)


@dataclass(frozen=True)
class ModuleCommand:
    """A module to run in a fresh interpreter of this environment (`python_argv`), and the run's
    copy of the child side it starts from when it is a child-side module (`pipeline/supervision/disguise.py`)."""

    module: str
    args: tuple[str, ...] = ()
    disguise: Disguise | None = None

    @property
    def argv(self) -> list[str]:
        return module_argv(self.module, *self.args, disguise=self.disguise)

    @property
    def started_as(self) -> str:
        """The module's name in the process: the copy's for a child-side module under a disguise."""
        return self.disguise.module(self.module) if self.disguise is not None else self.module


def python_argv(module: str, *args: str, disguise: Disguise | None = None) -> ModuleCommand:
    """The command that runs `module` in a fresh interpreter of this environment, with the
    target root (its cwd) off sys.path; the target's own paths are added by the harness. A
    child-side module runs from the run's copy when `disguise` is given."""
    return ModuleCommand(module, args, disguise)


def run_child(
    command: list[str] | ModuleCommand,
    *,
    cwd: Path,
    budget_s: float,
    scratch: Path,
    env: dict[str, str] | None = None,
    name: str = "child",
    stdin_data: bytes | Callable[[int], bytes] | None = None,
    channel: bool = False,
    warm: WarmPool | None = None,
    keep_s: float | None = None,
    ready_wait_s: float | None = None,
    watch: Callable[[bytes], bool | None] | None = None,
) -> ChildResult:
    """Run the command (an argv, or a module: `python_argv`) with its own process group; kill
    the group at the budget. `stdin_data` is written to the child's stdin (then closed); a
    callable is given the number of the channel's write end. `channel`: the child gets the
    write end of a pipe (`pass_fds`); what it wrote is `ChildResult.channel`, complete only
    once the child, its group and its leftovers are dead, so nothing can write to it after the
    child is gone; `watch` is shown its bytes as they come, until it returns True or False.
    `warm`: fork the child from the pool's warm interpreter for its environment when the
    command is a module (`python_argv`) and that interpreter can serve it, else start a fresh one.
    `keep_s`: what the run keeps of its budget whatever it waits for first (a warm interpreter's
    imports): by default the dumps' allowance. `ready_wait_s`: how long to wait for them before
    the budget starts instead (the gate's time, not the run's); `stdin_data` is built after.
    """
    scratch.mkdir(parents=True, exist_ok=True)
    module, argv = (command, command.argv) if isinstance(command, ModuleCommand) else (None, command)
    (stacks_path := _stacks_path(scratch, name, module)).unlink(missing_ok=True)
    out_path, err_path = scratch / f"{name}.stdout", scratch / f"{name}.stderr"
    child_env, tag = _tagged_env(env, module, stacks_path, name)
    # A warm interpreter's imports: waited for outside the lock, never into what the run keeps.
    started = time.monotonic()
    fork_from = _ready(warm, module, child_env, cwd, start_wait(budget_s, keep_s) if ready_wait_s is None else ready_wait_s)
    if ready_wait_s is not None:
        started = time.monotonic()  # that wait was the gate's, outside the budget
    pipe = _ChannelPipe(watch) if channel else None
    if callable(stdin_data):
        stdin_data = stdin_data(pipe.write_fd if pipe else -1)
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        with spawned.LOCK:  # no leftover scan may see this child before it is registered
            try:
                proc = _start(argv, module, cwd, child_env, out, err, stdin_data is not None, pipe, fork_from, tag)
            finally:
                if pipe:
                    pipe.started()  # the parent's copy of the write end goes either way
            spawned.RUNNING[proc.pid] = tag
        if stdin_data is not None:
            _feed_stdin(proc, stdin_data)
        timed_out, processes = _wait_within_budget(proc, budget_s, spent_s=time.monotonic() - started)
    # The run's time: until its group was dead. Reaping what left the group is this process's.
    duration_s = time.monotonic() - started
    leftovers = _kill_leftovers(proc.pid, tag, disguise.tag_names(module.disguise if module is not None else None))
    channel_data, channel_problem = pipe.collect() if pipe else (b"", None)
    return ChildResult(
        argv=argv, returncode=proc.returncode, timed_out=timed_out, duration_s=duration_s,
        stdout=_read(out_path), stderr=_read(err_path), stacks=_keep_stacks(stacks_path, scratch / f"{name}.stacks"),
        processes=processes, leftovers=leftovers, channel=channel_data, channel_problem=channel_problem,
    )


def _ready(warm: WarmPool | None, module: ModuleCommand | None, env: dict[str, str], cwd: Path, wait_s: float) -> WarmInterpreter | None:
    """The warm interpreter a module's run forks from, once its imports are done (`wait_s`)."""
    return warm.ready_for(env, cwd, wait_s) if warm is not None and module is not None else None


def _tagged_env(env: dict[str, str] | None, module: ModuleCommand | None, stacks_path: Path, name: str) -> tuple[dict[str, str], str]:
    """The child's environment with its stacks file and its run tag (under the names the copy
    it runs from reads), and the tag."""
    mask, runs = (module.disguise, module.module) if module is not None else (None, "")
    child_env = {**child_environment(env), disguise.stacks_env(runs, mask): str(stacks_path)}
    tag = child_env[disguise.tag_env(runs, mask)] = f"{os.getpid()}:{name}:{next(spawned.RUN_NUMBERS)}"
    return child_env, tag


def _stacks_path(scratch: Path, name: str, module: ModuleCommand | None) -> Path:
    """Where the child writes its stacks: the work folder, or for a child-side module under a
    disguise a neutral file in the copy's folder (the path is in the child's environment)."""
    if module is not None and module.disguise is not None and module.disguise.holds(module.module):
        return Path(module.disguise.folder) / f".{secrets.token_hex(6)}"
    return scratch / f"{name}.stacks"


def _keep_stacks(written: Path, kept: Path) -> str:
    """The stacks the child wrote, also left in the work folder for people."""
    text = _read(written)
    if written != kept:
        written.unlink(missing_ok=True)
        if text:
            kept.write_text(text)
    return text


def child_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment `run_child` gives a child for `env` (default: this process's), but for
    the run's own tag and stack file."""
    found = dict(os.environ if env is None else env)
    found.setdefault("PYTHONUNBUFFERED", "1")
    return found


def _start(
    argv: list[str], module: ModuleCommand | None, cwd: Path, env: dict[str, str], out: IO[bytes], err: IO[bytes], stdin: bool,
    pipe: _ChannelPipe | None, warm: WarmInterpreter | None, tag: str,
) -> subprocess.Popen[bytes] | ForkedChild:
    """A fork of `warm` running `module` when it can serve this run now, else a fresh interpreter."""
    if warm is not None and module is not None:
        forked = warm.launch(module.started_as, env, cwd, out, err, stdin=stdin, channel_fd=pipe.write_fd if pipe else None, run_tag=tag)
        if forked is not None:
            return forked
    return subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=out, stderr=err,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        pass_fds=(pipe.write_fd,) if pipe else (), start_new_session=True,
    )


def dump_allowance(budget_s: float) -> float:
    """The stack dumps take up to a second: they begin this long before the budget ends, so
    the kill lands on it."""
    return min(1.0, budget_s * 0.1)


def start_wait(budget_s: float, keep_s: float | None = None) -> float:
    """How long a run may wait for its warm interpreter: what leaves it `keep_s` of its budget
    (by default the stack dumps' allowance). Past it the run starts fresh in what is left, so
    however long the imports take under load, the run ends within its budget."""
    return max(0.0, budget_s - (dump_allowance(budget_s) if keep_s is None else keep_s))


# What killing a group and reaping its leader takes, kept back from the dumps' pauses.
KILL_S = 0.1
# The least time a round of stack dumps is given to be written, however late it began.
MIN_PAUSE_S = 0.05


def _dump_pause(ends: float, rounds: int) -> float:
    """How long each round of stack dumps is given to be written: what is left of the budget
    (which ends at `ends`, on the monotonic clock) after reading the group, less the kill's
    share, split between the rounds; at most 0.4 s. On a busy machine reading the group from
    /proc takes a good part of the allowance, and the kill still lands on the budget."""
    return min(0.4, max(MIN_PAUSE_S, (ends - KILL_S - time.monotonic()) / rounds))


def _wait_within_budget(proc: subprocess.Popen[bytes] | ForkedChild, budget_s: float, spent_s: float = 0.0) -> tuple[bool, list[dict[str, str]]]:
    """Wait for the child; past the budget (of which `spent_s` went before it started: a warm
    interpreter's imports), dump every thread's stacks and kill its group. Whether it timed
    out, and the processes of its group at that moment."""
    timed_out = False
    processes: list[dict[str, str]] = []
    ends = time.monotonic() + budget_s - spent_s
    try:
        # A hair above 0: a fork's wait with no timeout at all would not block, and read as a death.
        proc.wait(timeout=max(budget_s - dump_allowance(budget_s) - spent_s, 0.01))
    except subprocess.TimeoutExpired:
        timed_out = True
        processes = _group_processes(proc.pid)
        _dump_stacks(proc.pid, [int(p["pid"]) for p in processes], _dump_pause(ends, 2 if len(processes) > 1 else 1))
        kill_group(proc.pid)
        proc.wait()
    finally:
        if proc.returncode is None:  # interrupted while waiting
            kill_group(proc.pid)
            proc.wait()
        with spawned.LOCK:
            spawned.RUNNING.pop(proc.pid, None)
    kill_group(proc.pid)
    return timed_out, processes


# Children run_child is waiting on right now in this process (pid -> run tag): several run at
# once in one stage agent, and one run's cleanup must not touch another's processes.
def _kill_leftovers(child_pid: int, tag: str, tag_names: tuple[str, ...]) -> list[dict[str, Any]]:
    """Kill and reap every process the ended child left behind; return those that had left
    its process group or session (a setsid daemon), which the stage reports.

    Its orphans are reparented to this process (a child subreaper), so they are the
    descendants of this process that no running child holds and whose environment does not
    name another running child's run.
    """
    tags: dict[int, str | None] = {}
    with spawned.LOCK:
        running_pids, running_tags = set(spawned.RUNNING) | set(spawned.WARM), set(spawned.RUNNING.values())

        def belongs_to_another_run(info: ProcessInfo) -> bool:
            if info.pid in running_pids:
                return True
            if info.pid not in tags:
                found = next((v for n in tag_names if (v := environment_value(info.pid, n)) is not None), None)
                tags[info.pid] = read_tag(found) if found is not None else None
            return tags[info.pid] in running_tags

        # A served agents' host (`import_server.py`) is not below this process: the orphans of
        # an agent killed at its budget go to it, a subreaper, and are swept there.
        served = [pid for pid, warm in spawned.WARM.items() if warm.served]
        seen = [found for root in (None, *served) for found in kill_descendants(root, skip=belongs_to_another_run)]
    return [
        {
            **info.as_dict(),
            "escaped": "started its own session (setsid)" if info.sid != child_pid else "moved to its own process group (setpgid)",
            "tagged_by_this_run": tags.get(info.pid) == tag,
        }
        for info in seen
        if info.alive and info.pgid != child_pid
    ]


# More than this on a channel is not a result the harness writes: the rest is drained unread.
CHANNEL_CAP = 64 * 1024 * 1024
# What `watch` is shown at most: it looks for a first record of a few dozen bytes.
WATCHED_BYTES = 64 * 1024


class _ChannelPipe:
    """A pipe whose write end only the child holds; a thread drains the read end while the
    child runs (so a child writing much never blocks), and `collect` hands the bytes over
    once every writer is gone."""

    def __init__(self, watch: Callable[[bytes], bool | None] | None = None) -> None:
        self._read_fd, self.write_fd = os.pipe()
        self._chunks: list[bytes] = []
        self._size = 0
        self._overflow = False
        self._watch = watch
        self._reader = threading.Thread(target=self._drain, name="traingate-channel", daemon=True)

    def started(self) -> None:
        os.close(self.write_fd)
        self._reader.start()

    def _drain(self) -> None:
        while chunk := os.read(self._read_fd, 1 << 16):
            if self._size + len(chunk) > CHANNEL_CAP:
                self._overflow = True
                continue
            self._chunks.append(chunk)
            self._size += len(chunk)
            if self._watch is not None and self._watched() is not None:
                self._watch = None  # decided: the rest is only collected

    def _watched(self) -> bool | None:
        assert self._watch is not None
        if self._size > WATCHED_BYTES:
            return False
        try:
            return self._watch(b"".join(self._chunks))
        except Exception:  # noqa: BLE001 - whatever the watcher does, the channel is still drained
            return False

    def collect(self, grace_s: float = 5.0) -> tuple[bytes, str | None]:
        self._reader.join(grace_s)
        if self._reader.is_alive():
            # A process outside the child's reach still holds the write end: nothing read can be trusted.
            return b"", "the channel was still open after the child and its processes were killed"
        os.close(self._read_fd)
        if self._overflow:
            return b"", f"the child wrote more than {CHANNEL_CAP} bytes to its channel"
        return b"".join(self._chunks), None


def _feed_stdin(proc: subprocess.Popen[bytes] | ForkedChild, data: bytes) -> None:
    """Write the request on a thread: a child that never reads its stdin must not block us."""

    def feed() -> None:
        assert proc.stdin is not None
        try:
            proc.stdin.write(data)
        except OSError:  # the child died or closed its stdin first
            pass
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass

    threading.Thread(target=feed, name="traingate-stdin", daemon=True).start()


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _dump_stacks(main_pid: int, pids: list[int], pause_s: float) -> None:
    # The main process first, alone, so its dump comes first in the file.
    send_signal(main_pid, _DUMP_SIGNAL)
    time.sleep(pause_s)
    for pid in pids:
        if pid != main_pid:
            send_signal(pid, _DUMP_SIGNAL)
    if len(pids) > 1:
        time.sleep(pause_s)


def _group_processes(pgid: int) -> list[dict[str, str]]:
    """pid, state, command line and kernel wait channel of every process in the group."""
    found: list[dict[str, str]] = []
    for pid, info in sorted(process_table().items()):
        if info.pgid != pgid:
            continue
        try:
            wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        found.append({"pid": str(pid), "ppid": str(info.ppid), "state": info.state, "wchan": wchan, "cmdline": info.cmdline[:300]})
    return found
