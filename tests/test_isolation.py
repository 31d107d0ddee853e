"""Child processes: budgets, group kills, stack dumps, crash traces."""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path

from traingate.pipeline.supervision.isolation import run_child
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
