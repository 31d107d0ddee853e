"""No process outlives its stage, and one run per output folder.

The targets here are hostile: a daemon that detaches (double fork + setsid) and rewrites the
gate's outcome and reports to PASS, a test that sleeps while traingate is stopped, a slow
failure two runs collide on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TARGETS, TRAINGATE, run_gate
from traingate.pipeline.supervision.import_server import SERVER_ENV
from traingate.pipeline.supervision.isolation import run_child
from tests.own_processes import alive_below_this_process
from traingate.pipeline.supervision.processes import descendants, is_subreaper, process_table

FORGE_MARKER = "traingate-forge-daemon"
SLEEPER_MARKER = "traingate-sleeper-daemon"

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="child subreapers and /proc are Linux's")


@pytest.fixture(autouse=True)
def fresh_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gate runs here start their agents' hosts afresh, below the gate's process, as a CI
    job's do: the forging daemon finds the gate's output folder through its ancestors' command
    lines, which a host forked by the worker's import server does not have among them."""
    monkeypatch.delenv(SERVER_ENV, raising=False)


def _running_with(marker: str, under: int | None = None) -> list[int]:
    """Every live process on the machine whose command line holds `marker`, wherever it was
    reparented to (a scan of all of /proc, not only of this test's descendants); with `under`,
    only the descendants of that process (another worker may run a test with the same target)."""
    table = process_table()
    candidates = table.values() if under is None else descendants(under, table)
    return [p.pid for p in candidates if p.alive and marker in p.cmdline.split()]


def _wait_for(condition, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.1)


# -- the mechanism -------------------------------------------------------------------------


def test_the_test_process_is_a_subreaper() -> None:
    assert is_subreaper()


def test_run_child_kills_and_reports_a_setsid_daemon_but_not_its_own_workers(tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent("""
        import os, subprocess, sys, time
        worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "in-group-worker"])
        first = os.fork()
        if first == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "escaped-daemon"])
            os._exit(0)
        os.waitpid(first, 0)
        if os.fork() == 0:
            os.setpgid(0, 0)
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", "own-group"])
        time.sleep(0.5)
    """))
    result = run_child([sys.executable, str(script)], cwd=tmp_path, budget_s=30, scratch=tmp_path / "s", env=dict(os.environ))
    assert result.returncode == 0 and not result.timed_out
    escaped = {p["cmdline"].split()[-1]: p for p in result.leftovers}
    assert set(escaped) == {"escaped-daemon", "own-group"}
    assert escaped["escaped-daemon"]["escaped"] == "started its own session (setsid)"
    assert escaped["own-group"]["escaped"] == "moved to its own process group (setpgid)"
    assert all(p["tagged_by_this_run"] for p in result.leftovers)
    assert not alive_below_this_process()


def test_a_concurrent_run_keeps_its_processes_while_another_ends(tmp_path: Path) -> None:
    """Two children at once (the execution stage's pytest run and smoke call): the one that
    ends first kills its own leftovers, not the other's daemon that is still in use."""
    from concurrent.futures import ThreadPoolExecutor

    def child(seconds: float, name: str) -> list[str]:
        body = (
            "import os, sys, time\n"
            "first = os.fork()\n"
            "if first == 0:\n"
            "    os.setsid()\n"
            "    if os.fork() == 0:\n"
            f"        os.execv(sys.executable, [sys.executable, '-c', 'import time; time.sleep(600)', 'daemon-of-{name}'])\n"
            "    os._exit(0)\n"
            "os.waitpid(first, 0)\n"
            f"time.sleep({seconds})\n"
        )
        return [sys.executable, "-c", body]

    def run(seconds: float, name: str):
        return run_child(child(seconds, name), cwd=tmp_path, budget_s=30, scratch=tmp_path / name, env=dict(os.environ), name=name)

    with ThreadPoolExecutor(max_workers=2) as pool:
        short = pool.submit(run, 0.5, "short")
        long = pool.submit(run, 3.0, "long")
        short_result = short.result()
        assert _running_with("daemon-of-long"), "the short run's cleanup killed the long run's daemon"
        long_result = long.result()
    assert [p["cmdline"].split()[-1] for p in short_result.leftovers] == ["daemon-of-short"]
    assert [p["cmdline"].split()[-1] for p in long_result.leftovers] == ["daemon-of-long"]


# -- issue reproductions, end to end -------------------------------------------------------


def test_a_forging_daemon_is_killed_reported_and_cannot_rewrite_the_verdict(gate) -> None:
    run = gate("life_forge_daemon", "--stages", "execution", timeout=300)
    assert run.returncode == 1, run.stderr
    assert run.report["decision"] == "BLOCK"
    assert "test-failure" in run.categories()
    leftovers = run.findings("leftover-process")
    by_run = {f["title"].split(" left ")[0]: f for f in leftovers}
    assert set(by_run) == {"The test run", "The entrypoint's smoke call"}
    for finding in leftovers:
        assert finding["blocking"] and finding["severity"] == "high" and finding["evidence"]["kind"] == "observed"
        processes = finding["evidence"]["data"]["processes"]
        # A daemon caught between its fork and its exec still shows the harness's command line;
        # one caught inside its exec, none yet (the new image's arguments are not laid out).
        cmdlines = [p["cmdline"] for p in processes]
        assert cmdlines and all(FORGE_MARKER in c or ".harness.entrypoint" in c or ".execution.probe.pytest_launcher" in c or c == "" for c in cmdlines), cmdlines
        assert all(p["escaped"] == "started its own session (setsid)" for p in processes)
    # The test run starts two daemons (one test directly, one through train()).
    assert len(by_run["The test run"]["evidence"]["data"]["processes"]) == 2
    # Long after traingate exited the files still say what it decided.
    time.sleep(2)
    on_disk = json.loads((run.out / "report.json").read_text())
    assert on_disk["decision"] == "BLOCK" and on_disk == run.report
    assert "**BLOCK**" in (run.out / "report.md").read_text()
    assert not _running_with(FORGE_MARKER)


def test_a_second_run_on_the_same_out_folder_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = subprocess.Popen(
        [*TRAINGATE, "run", str(TARGETS / "life_slow_failure"), "--out", str(out), "--stages", "execution"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        # The first run holds the folder once its stage's work folder exists.
        _wait_for(lambda: (out / "work" / "execution").is_dir(), 120, "the first run to start its stage")
        before = sorted(p.relative_to(out) for p in out.rglob("*"))
        second = run_gate(TARGETS / "life_slow_failure", out, "--stages", "execution", timeout=120)
        assert second.returncode == 2
        [message] = second.stderr.strip().splitlines()
        assert f"{out} is in use by another traingate run (pid {first.pid})" in message
        assert not second.stdout
        # The refused run removed nothing of the first run's.
        assert set(before) <= set(p.relative_to(out) for p in out.rglob("*"))
        stdout, stderr = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 1, stderr
    report = json.loads((out / "report.json").read_text())
    assert report["decision"] == "BLOCK" and report["task"] == "LIFE-SLOW"
    [failure] = [f for s in report["stages"] for f in s["findings"] if f["category"] == "test-failure"]
    assert failure["location"]["path"] == "tests/test_slow.py"


def test_a_new_run_clears_the_reports_of_the_last_one(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "work" / "performance").mkdir(parents=True)
    (out / "work" / "performance" / "outcome.json").write_text("{}")
    (out / "performance.md").write_text("# PASS\n")
    (out / "report.json").write_text(json.dumps({"decision": "PASS"}))
    # An invalid configuration ends the run before any stage, with a report of its own.
    target = tmp_path / "target"
    target.mkdir()
    (target / "pyproject.toml").write_text('[tool.traingate]\nunknown_key = 1\n')
    run = run_gate(target, out)
    assert run.returncode == 2
    assert run.report["decision"] == "BLOCK"
    assert not (out / "performance.md").exists() and not (out / "work" / "performance").exists()
    assert not list(out.glob(".*.tmp"))


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stopped_run_stops_everything_and_leaves_no_verdict(tmp_path: Path, signum: int, status: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    stale = {"decision": "PASS", "score": 100}
    (out / "report.json").write_text(json.dumps(stale))
    gate = subprocess.Popen(
        [*TRAINGATE, "run", str(TARGETS / "life_sleeper"), "--out", str(out), "--stages", "execution"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
    )
    try:
        # Only this run's daemon: the other parameter's run may be on another worker right now.
        _wait_for(lambda: bool(_running_with(SLEEPER_MARKER, under=gate.pid)), 120, "the target's test to detach its daemon")
        sleepers = _running_with(SLEEPER_MARKER, under=gate.pid)
        sent = time.monotonic()
        gate.send_signal(signum)
        _, stderr = gate.communicate(timeout=15)
        took = time.monotonic() - sent
    finally:
        if gate.poll() is None:
            gate.kill()
            gate.wait()
    assert gate.returncode == status, stderr
    assert took < 5
    assert "interrupted" in stderr and "Traceback" not in stderr
    assert sleepers and not set(sleepers) & set(_running_with(SLEEPER_MARKER))
    assert not alive_below_this_process()
    assert not (out / "report.json").exists()
    assert not (out / "report.md").exists()


def test_every_stage_reports_what_its_entrypoint_runs_left(gate) -> None:
    run = gate("life_daemon_trainer", "--stages", "performance,concurrency", timeout=400)
    assert run.returncode == 1, run.stderr
    for stage in ("performance", "concurrency"):
        [finding] = run.findings("leftover-process", stage=stage)
        processes = finding["evidence"]["data"]["processes"]
        # One uploader per run of the entrypoint in that stage, each named with its run.
        runs = {r["label"] for r in run.stage(stage)["details"].get("runs", [])} if stage == "concurrency" else set()
        assert processes and all("traingate-uploader-daemon" in p["cmdline"] for p in processes)
        assert len({p["run"] for p in processes}) == len(processes)
        assert not runs or {p["run"] for p in processes} == runs
    assert not _running_with("traingate-uploader-daemon")
