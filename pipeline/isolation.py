"""Run a child process in its own process group, under a wall budget.

On overrun every process of the group is asked to dump the stacks of all its threads
(faulthandler on SIGUSR1, installed by `traingate.stages.harness.guard`), the state of each process is
read from /proc, and the whole group is killed, DataLoader workers included. After a normal
exit the group is killed too, so no orphaned worker outlives its run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

STACKS_ENV = "TRAINGATE_STACKS_FILE"
_DUMP_SIGNAL = signal.SIGUSR1
_MAIN_HEADER = re.compile(r"^# traingate main pid (\d+) thread (0x[0-9a-f]+)$", re.M)


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    function: str


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


# Runs a module as __main__ without the current folder on sys.path (what `-P` does on 3.11+):
# children start in the target's root, whose own folders must never shadow traingate's modules.
_SAFE_PATH_BOOTSTRAP = "import runpy, sys; sys.path.pop(0); sys.argv[0] = sys.argv[1]; del sys.argv[1]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"


def python_argv(module: str, *args: str) -> list[str]:
    """The command line that runs `module` in a fresh interpreter of this environment, with the
    target root (its cwd) off sys.path; the target's own paths are added by the harness."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _SAFE_PATH_BOOTSTRAP, module, *args]


def run_child(
    argv: list[str],
    *,
    cwd: Path,
    budget_s: float,
    scratch: Path,
    env: dict[str, str] | None = None,
    name: str = "child",
) -> ChildResult:
    """Run argv with its own process group; kill the group at the budget."""
    scratch.mkdir(parents=True, exist_ok=True)
    stacks_path = scratch / f"{name}.stacks"
    stacks_path.unlink(missing_ok=True)
    out_path, err_path = scratch / f"{name}.stdout", scratch / f"{name}.stderr"
    child_env = dict(os.environ if env is None else env)
    child_env[STACKS_ENV] = str(stacks_path)
    child_env.setdefault("PYTHONUNBUFFERED", "1")
    started = time.monotonic()
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=child_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        timed_out = False
        processes: list[dict[str, str]] = []
        # The stack dumps take up to a second: begin them early so the kill lands on budget.
        dump_allowance = min(1.0, budget_s * 0.1)
        try:
            proc.wait(timeout=max(budget_s - dump_allowance, 0.1))
        except subprocess.TimeoutExpired:
            timed_out = True
            processes = _group_processes(proc.pid)
            _dump_stacks(proc.pid, [int(p["pid"]) for p in processes])
            _kill_group(proc.pid)
            proc.wait()
        finally:
            if proc.returncode is None:  # interrupted while waiting
                _kill_group(proc.pid)
                proc.wait()
        _kill_group(proc.pid)
    return ChildResult(
        argv=argv,
        returncode=proc.returncode,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        stdout=_read(out_path),
        stderr=_read(err_path),
        stacks=_read(stacks_path),
        processes=processes,
    )


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def _dump_stacks(main_pid: int, pids: list[int]) -> None:
    # The main process first, alone, so its dump comes first in the file.
    _signal(main_pid, _DUMP_SIGNAL)
    time.sleep(0.4)
    for pid in pids:
        if pid != main_pid:
            _signal(pid, _DUMP_SIGNAL)
    if len(pids) > 1:
        time.sleep(0.4)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _group_processes(pgid: int) -> list[dict[str, str]]:
    """pid, state, command line and kernel wait channel of every process in the group."""
    found: list[dict[str, str]] = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            wchan = (entry / "wchan").read_text().strip() if (entry / "wchan").exists() else ""
        except (OSError, ValueError, IndexError):
            continue
        found.append({"pid": entry.name, "ppid": fields[1], "state": fields[0], "wchan": wchan, "cmdline": cmdline[:300]})
    return sorted(found, key=lambda p: int(p["pid"]))


_THREAD_RE = re.compile(r"^(?:(?:Current thread|Thread) (0x[0-9a-f]+)|Stack) \(most recent call first\)", re.M)
_FRAME_RE = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def parse_dump(text: str) -> list[tuple[str, list[Frame]]]:
    """faulthandler's dump: [(thread id, frames innermost first)] in file order."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        head = _THREAD_RE.match(line)
        if head:
            threads.append((head.group(1) or "", []))
            continue
        frame = _FRAME_RE.match(line)
        if frame and threads:
            threads[-1][1].append(Frame(frame.group(1), int(frame.group(2)), frame.group(3).strip()))
    return threads


def main_thread_frames(stacks: str) -> list[Frame]:
    header = _MAIN_HEADER.search(stacks)
    threads = parse_dump(stacks[header.end():] if header else stacks)
    if not threads:
        return []
    if header:
        wanted = int(header.group(2), 16)
        for ident, frames in threads:
            if ident and int(ident, 16) == wanted:
                return frames
    return threads[0][1]


def crash_frames(stacks: str) -> list[Frame]:
    """Frames (innermost first) of the stack dumped when the process killed itself or died
    of a fatal signal; empty when it left no trace (an outside SIGKILL)."""
    marks = [m.end() for m in re.finditer(r"^(?:# traingate self-signal .*|Fatal Python error: .*)$", stacks, re.M)]
    if not marks:
        return []
    threads = parse_dump(stacks[marks[-1]:])
    return threads[0][1] if threads else []
