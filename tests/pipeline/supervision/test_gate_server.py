"""The gate server (pipeline/gate/gate_server.py): `traingate` runs as its fork, in the
caller's folder, with the caller's output, environment and exit status; signals reach the run,
and a caller that dies takes its run and everything below it along."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from traingate.pipeline.gate import gate_server
from traingate.pipeline.supervision import import_server
from traingate.pipeline.supervision.processes import ProcessInfo, descendants, process_table

from tests.conftest import TARGETS, TRAINGATE, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the import server is Linux only")]

SLEEPER_MARKER = "traingate-sleeper-daemon"  # tests/targets/life_sleeper's detached daemon


@contextlib.contextmanager
def _server() -> Iterator[tuple[dict[str, str], subprocess.Popen[bytes]]]:
    """An import server of this test's own, the environment of the commands it serves, and its
    process; ready (`wait_ready`) once its gate server answers too."""
    folder = Path(tempfile.mkdtemp(prefix="tg-gate-test-"))
    socket_path = folder / "socket"
    gate_env = cli_env({k: v for k, v in os.environ.items() if k != import_server.SERVER_ENV})
    process = import_server.start(socket_path, gate_env, "cpu")
    try:
        assert import_server.wait_ready(socket_path, process), (folder / "import-server.stderr").read_text()
        assert Path(gate_server.socket_path(str(socket_path))).exists(), (folder / "gate-server.stderr").read_text()
        yield {**gate_env, import_server.SERVER_ENV: str(socket_path)}, process
    finally:
        import_server.stop(process)
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[dict[str, str], subprocess.Popen[bytes]]]:
    with _server() as server:
        yield server


def _below(server: subprocess.Popen[bytes]) -> list[ProcessInfo]:
    """What runs below the server but the server's residents (itself and its gate server)."""
    resident = import_server.residents(server.pid)
    return [p for p in descendants(server.pid) if p.pid not in resident and p.alive]


def _wait_for(condition, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.1)


def _sleeper_run(served, tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """`traingate run life_sleeper` served, once its target's daemon runs; the caller and the
    process the gate server forked for it."""
    env, server = served
    caller = subprocess.Popen(
        [*TRAINGATE, "run", str(TARGETS / "life_sleeper"), "--out", "out", "--stages", "execution"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )
    _wait_for(lambda: any(SLEEPER_MARKER in p.cmdline.split() for p in _below(server)), 120, "the target's daemon")
    return caller, _command_of(server)


def _command_of(server: subprocess.Popen[bytes]) -> int:
    """The one command the server's gate server runs now."""
    table = process_table()
    [gates] = [pid for pid in import_server.residents(server.pid) if import_server.GATE_SERVER.encode().hex() in table[pid].cmdline]
    [command] = [p for p in table.values() if p.ppid == gates and p.alive]
    return command.pid


def test_a_served_command_runs_in_the_callers_folder_and_answers_on_its_output(served, tmp_path: Path) -> None:
    env, server = served
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [*TRAINGATE, "run", str(TARGETS / "corr_clean"), "--out", "out", "--stages", "correctness"],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    assert done.returncode == 0, done.stderr
    assert "Decision: PASS" in done.stdout
    assert json.loads((tmp_path / "out" / "report.json").read_text())["decision"] == "PASS"  # `--out out`: the caller's folder
    # The caller imported nothing of the gate and started nothing: a fresh run costs seconds.
    assert after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime < 0.5
    assert not _below(server)
    # Arguments the command line refuses: its usage error and exit status, as from a fresh one.
    usage = subprocess.run([*TRAINGATE, "run", "--stages", "nosuchstage"], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert usage.returncode == 2 and "nosuchstage" in usage.stderr


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_to_the_caller_stops_its_run_as_it_stops_a_fresh_one(served, tmp_path: Path, signum: int, status: int) -> None:
    env, server = served
    caller, command = _sleeper_run(served, tmp_path)
    try:
        assert Path(f"/proc/{command}/cwd").resolve() == tmp_path.resolve()
        assert not descendants(caller.pid)  # the run is the server's fork, not the caller's child
        caller.send_signal(signum)
        _, stderr = caller.communicate(timeout=30)
    finally:
        if caller.poll() is None:
            caller.kill()
            caller.wait()
    assert caller.returncode == status, stderr
    assert "interrupted" in stderr and "Traceback" not in stderr
    _wait_for(lambda: not _below(server), 10, "the run's processes to end")


def test_a_caller_that_dies_takes_its_run_and_everything_below_it(served, tmp_path: Path) -> None:
    env, server = served
    caller, command = _sleeper_run(served, tmp_path)
    caller.kill()
    caller.communicate()
    _wait_for(lambda: not _below(server), 15, "the server to kill the run")
    assert not [p for p in process_table().values() if SLEEPER_MARKER in p.cmdline.split() and p.alive]


def test_a_process_that_is_not_the_servers_parent_or_its_child_is_refused(served) -> None:
    """A target's process (a grandchild of the process that started the server) runs nothing
    there: `run_served` answers None, and the command would run in that process itself."""
    env, _ = served
    inner = "import sys; from traingate.pipeline.gate.gate_server import run_served; print(run_served('traingate', ['--help']))"
    outer = f"import subprocess, sys; sys.exit(subprocess.run([sys.executable, '-c', {inner!r}]).returncode)"
    done = subprocess.run([sys.executable, "-c", outer], env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "None", done.stderr


def test_a_command_whose_interpreter_would_start_otherwise_is_refused(served, tmp_path: Path) -> None:
    """Another PYTHONPATH (a plugin's stages, say) changes what a fresh `traingate` imports: the
    server refuses the command, which then runs in its own process."""
    env, _ = served
    ask = "from traingate.pipeline.gate.gate_server import run_served; print(run_served('traingate', ['--help']))"
    refused = subprocess.run([sys.executable, "-c", ask], env={**env, "PYTHONPATH": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert refused.stdout.strip() == "None", refused.stderr
    served_help = subprocess.run([sys.executable, "-c", ask], env=env, capture_output=True, text=True, timeout=60)
    assert "usage: traingate" in served_help.stdout and served_help.stdout.strip().endswith("0"), served_help.stderr


def test_a_run_whose_server_ends_first_runs_again_in_the_callers_process_and_still_gives_its_verdict(tmp_path: Path) -> None:
    with _server() as (env, server):
        caller = subprocess.Popen(
            [*TRAINGATE, "run", str(TARGETS / "corr_clean"), "--out", "out", "--stages", "correctness"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
        )
        _wait_for(lambda: bool([p for p in _below(server) if p.ppid not in import_server.residents(server.pid)]), 60, "the run's agent")
        import_server.stop(server)
    stdout, stderr = caller.communicate(timeout=300)
    assert caller.returncode == 0, stderr
    assert "running it again in this process" in stderr and "Decision: PASS" in stdout
    assert json.loads((tmp_path / "out" / "report.json").read_text())["decision"] == "PASS"


def test_what_the_server_imported_is_set_aside_from_the_collector_of_its_forks() -> None:
    """A full collection in a fork would otherwise walk every object the imports made (about
    30 ms of each served run, and a write to every page the fork shares with the server)."""
    import gc

    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            gc.unfreeze()
            gate_server._imports()
            code = 0 if gc.get_freeze_count() > 10_000 and gc.isenabled() else 3
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0
