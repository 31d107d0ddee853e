"""Child processes: budgets, group kills, stack dumps, crash traces."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import cast

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.supervision.isolation import dump_allowance, python_argv, run_child
from traingate.pipeline.supervision.warm import WarmInterpreter
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import StageContext
from traingate.stages.common.stacks import crash_frames, main_thread_frames
from tests.conftest import REPO, line_of


def _script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text("from traingate.stages.common import guard\nguard.install()\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def _line(argv: list[str], text: str) -> int:
    return line_of(Path(argv[-1]), text)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_overrun_kills_the_whole_group_and_dumps_the_waiting_frame(tmp_path: Path) -> None:
    argv = _script(tmp_path, """
        import subprocess, sys, threading, time
        grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open("grandchild.pid", "w").write(str(grandchild.pid))
        threading.Event().wait()  # waits here
    """)
    started = time.monotonic()
    result = run_child(argv, cwd=tmp_path, budget_s=3, scratch=tmp_path / "s", env=_env())
    assert time.monotonic() - started < 4.5
    assert result.timed_out
    assert len(result.processes) == 2
    grandchild = int((tmp_path / "grandchild.pid").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{grandchild}").exists() or "Z" in Path(f"/proc/{grandchild}/stat").read_text().split()[2]
    frames = main_thread_frames(result.stacks)
    child_frame = next(f for f in frames if f.path.endswith("child.py"))
    assert child_frame.line == _line(argv, "# waits here")


def test_normal_exit_still_reaps_leftover_workers(tmp_path: Path) -> None:
    argv = _script(tmp_path, """
        import subprocess, sys
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open("orphan.pid", "w").write(str(p.pid))
    """)
    result = run_child(argv, cwd=tmp_path, budget_s=30, scratch=tmp_path / "s", env=_env())
    assert result.returncode == 0 and not result.timed_out
    orphan = int((tmp_path / "orphan.pid").read_text())
    time.sleep(0.2)
    assert not Path(f"/proc/{orphan}").exists() or "Z" in Path(f"/proc/{orphan}/stat").read_text().split()[2]


def test_self_inflicted_sigkill_leaves_its_call_site(tmp_path: Path) -> None:
    argv = _script(tmp_path, """
        import os, signal
        def boom():
            os.kill(os.getpid(), signal.SIGKILL)
        boom()
    """)
    result = run_child(argv, cwd=tmp_path, budget_s=30, scratch=tmp_path / "s", env=_env())
    assert result.signal_name == "SIGKILL"
    frame = next(f for f in crash_frames(result.stacks) if f.path.endswith("child.py"))
    assert (frame.line, frame.function) == (_line(argv, "os.kill("), "boom")


def test_segfault_leaves_its_stack(tmp_path: Path) -> None:
    argv = _script(tmp_path, """
        import ctypes
        ctypes.string_at(0)
    """)
    result = run_child(argv, cwd=tmp_path, budget_s=30, scratch=tmp_path / "s", env=_env())
    assert result.signal_name == "SIGSEGV"
    assert any(f.path.endswith("child.py") and f.line == _line(argv, "string_at") for f in crash_frames(result.stacks))


# A run that waits for a warm interpreter (a busy machine's imports) keeps what it must keep of
# its budget: the wait never runs into it, and the call ends within the budget.


class _StillImporting:
    """A warm pool whose interpreter is still importing: `ready_for` waits all it is allowed."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def ready_for(self, env: dict[str, str], cwd: Path, timeout_s: float) -> None:
        self.asked.append(timeout_s)
        time.sleep(timeout_s)


def test_a_run_whose_warm_interpreter_is_late_keeps_its_margin_and_its_budget(tmp_path: Path) -> None:
    pool = _StillImporting()
    waits_a_minute = python_argv("timeit", "-n", "1", "-r", "1", "import time; time.sleep(60)")
    started = time.monotonic()
    result = run_child(waits_a_minute, cwd=tmp_path, budget_s=3, scratch=tmp_path / "s", env=_env(), warm=cast(WarmPool, pool), keep_s=1.5)
    elapsed = time.monotonic() - started
    assert pool.asked == [1.5]  # not the whole budget: the run keeps 1.5 s of it
    assert result.timed_out and elapsed < 3 + 0.5, elapsed
    # Without a margin of its own, the run keeps the stack dumps' allowance.
    default = _StillImporting()
    run_child(waits_a_minute, cwd=tmp_path, budget_s=3, scratch=tmp_path / "d", env=_env(), warm=cast(WarmPool, default))
    assert default.asked == [3 - dump_allowance(3)]


def test_a_wait_for_the_gates_own_imports_before_the_budget_leaves_the_run_its_whole_budget(tmp_path: Path) -> None:
    # A stage agent waits for the agents' host before its budget starts: under load those imports
    # are the gate's time, and the target's run still gets every second of its budget after it.
    pool = _StillImporting()
    sleeps = python_argv("timeit", "-n", "1", "-r", "1", "import time; time.sleep(1.2)")
    built_at: list[float] = []

    def request(fd: int) -> bytes:
        built_at.append(time.monotonic())
        return b""

    started = time.monotonic()
    result = run_child(sleeps, cwd=tmp_path, budget_s=3, scratch=tmp_path / "s", env=_env(), warm=cast(WarmPool, pool), keep_s=1.5, ready_wait_s=2.5, stdin_data=request)
    assert pool.asked == [2.5]
    assert not result.timed_out and result.returncode == 0  # 2.5 s of wait + 1.2 s of run > 3 s
    assert result.duration_s < 2.5 and built_at[0] - started >= 2.5  # the request (its deadline) is built after the wait


def test_a_stage_that_started_late_gives_its_runs_nothing_of_its_margin(tmp_path: Path) -> None:
    ctx = StageContext(stage="execution", root=tmp_path, config=TargetConfig(), device="cpu", deadline=time.time() + 1.5, scratch=tmp_path, margin_s=2.0)
    assert ctx.child_budget() == 0.0
    ctx.deadline = time.time() + 10
    assert 7.5 < ctx.child_budget() <= 8.0


def test_a_wait_for_imports_that_times_out_leaves_the_interpreter_to_later_runs(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs, subprocess.Popen([sys.executable, "-c", "pass"]) as process:
        warm = WarmInterpreter(dict(os.environ), tmp_path, ours, process)
        assert not warm.wait_ready(0.2)
        assert not warm.wait_ready(0.0)
        theirs.sendall(b"ready")  # the imports finished: the next run forks from it
        assert warm.wait_ready(1.0)
