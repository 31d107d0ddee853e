"""Runs forked from a warm interpreter behave, for `run_child`, as fresh interpreters do.

The child here is a small module on PYTHONPATH that reports what it sees; what it does comes
on its stdin (its environment must equal the interpreter's for the fork to be used). Whether a
run was forked shows in `torch` being imported before the module's first line.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from traingate.pipeline.supervision.isolation import child_environment, python_argv, run_child
from traingate.pipeline.supervision.warm_pool import WarmPool
from tests.own_processes import alive_below_this_process
from traingate.pipeline.supervision.processes import descendants
from tests.pipeline.supervision.warm_probe import PROBE, probe_facts as _facts, run_probe as _run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm start is Linux's")

# A stage agent's part, as `traingate.stages.agent` plays it: take the interpreter handed down to
# this process and run the probe through it.
AGENT = textwrap.dedent('''
    import gc, json, os, sys
    prepared = "traingate.stages.agent.preload" in sys.modules
    from pathlib import Path
    from traingate.pipeline.supervision.isolation import python_argv, run_child
    from traingate.pipeline.supervision.warm_pool import WarmPool
    from traingate.stages.common import inherited

    handed = inherited.take()
    scratch = Path(os.environ.pop("AGENT_SCRATCH"))
    from traingate.pipeline.model.registry import build_registry

    facts = {"agent": os.getpid(), "torch": "torch" in sys.modules, "prepared": prepared, "registry_built": build_registry.cache_info().currsize == 1, "frozen": gc.get_freeze_count() > 0, "handed": handed is not None}
    pool = WarmPool(scratch, handed_down=handed)
    try:
        run = run_child(
            python_argv("warmprobe"), cwd=Path.cwd(), budget_s=60, scratch=scratch, env=dict(os.environ), name="run",
            stdin_data=lambda fd: json.dumps({"action": "report", "channel": fd}).encode(), channel=True, warm=pool,
        )
        [interpreter] = pool.interpreters()
        with open(f"/proc/{interpreter.pid}/stat") as stat:
            facts["interpreter_parent"] = int(stat.read().rsplit(")", 1)[1].split()[1])
        facts["interpreter"] = interpreter.pid
    finally:
        pool.close()
    facts["run"] = json.loads(run.stdout)
    facts["started_here"] = sorted(p.name for p in scratch.glob("warm-*"))
    print(json.dumps(facts))
''')


@pytest.fixture
def probe_env(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "warmprobe.py").write_text(PROBE)
    return {**os.environ, "PYTHONPATH": str(folder), "WARM_MARKER": "the run's environment"}


def test_a_forked_run_has_its_own_session_descriptors_environment_and_folder(tmp_path: Path, probe_env: dict[str, str]) -> None:
    pool = WarmPool(tmp_path / "scratch")
    try:
        first = _run(pool, tmp_path, probe_env, "facts")
        second = _run(pool, tmp_path, probe_env, "facts")
        [warm_pid] = {p.pid for p in descendants(os.getpid()) if p.alive and "traingate.stages.harness.fork_server" in p.cmdline}
    finally:
        pool.close()
    facts, again = _facts(first), _facts(second)
    assert facts["preloaded"] and again["preloaded"]
    assert facts["ppid"] == again["ppid"] == warm_pid and facts["pid"] != again["pid"]
    # As with start_new_session: the run leads its own session and group, which the budget's kill addresses.
    assert facts["pid"] == facts["sid"] == facts["pgid"]
    assert facts["cwd"] == str(tmp_path) and facts["marker"] == "the run's environment"
    assert facts["name"] == "__main__" and facts["argv0"].endswith("warmprobe.py")
    # /proc/<pid>/environ names the run, not the interpreter it was forked from.
    assert facts["environ_tag"] == [f"{os.getpid()}:probe-facts:{facts['environ_tag'][0].rsplit(':', 1)[-1]}"]
    assert first.channel == b"channel ok" and first.channel_problem is None
    assert "to stderr" in first.stderr and not first.leftovers and not first.timed_out
    assert not alive_below_this_process()


def test_exit_codes_the_budget_and_leftovers_are_the_runs_own(tmp_path: Path, probe_env: dict[str, str]) -> None:
    pool = WarmPool(tmp_path / "scratch")
    try:
        exited = _run(pool, tmp_path, probe_env, "exit")
        slept = _run(pool, tmp_path, probe_env, "sleep", budget_s=3)
        daemon = _run(pool, tmp_path, probe_env, "daemon")
        after = _run(pool, tmp_path, probe_env, "facts")
    finally:
        pool.close()
    assert exited.returncode == 3 and not exited.timed_out
    assert slept.timed_out and slept.returncode == -9 and 2.5 < slept.duration_s < 10
    assert 'warmprobe.py", line' in slept.stacks
    # A daemon forked without an exec shows the run's tag in the environment block it inherited:
    # reported as that run's, killed; the interpreter itself is not.
    [left] = daemon.leftovers
    assert left["escaped"] == "started its own session (setsid)" and left["tagged_by_this_run"]
    assert "traingate.stages.harness.fork_server" in left["cmdline"]
    assert _facts(after)["preloaded"]


def test_runs_at_once_share_one_interpreter_and_keep_their_own_leftovers(tmp_path: Path, probe_env: dict[str, str]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    pool = WarmPool(tmp_path / "scratch")
    try:
        with ThreadPoolExecutor(max_workers=2) as threads:
            # The first run leaves a daemon, then waits while the second runs and ends.
            slow = threads.submit(_run, pool, tmp_path, probe_env, "daemon-then-wait", wait=3)
            quick = threads.submit(_run, pool, tmp_path, probe_env, "facts")
            quick_run = quick.result()
            overlapped = not slow.done()
            slow_run = slow.result()
    finally:
        pool.close()
    facts = _facts(quick_run)
    assert facts["preloaded"] and slow_run.returncode == 0
    # Both were forks of the one interpreter, the second while the first still ran.
    assert overlapped and facts["ppid"] == _facts(slow_run)["ppid"] != os.getpid()
    assert not quick_run.leftovers
    [left] = slow_run.leftovers
    assert left["tagged_by_this_run"] and left["escaped"] == "started its own session (setsid)"
    assert not alive_below_this_process()


def test_another_folder_shares_the_interpreter(tmp_path: Path, probe_env: dict[str, str]) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    pool = WarmPool(tmp_path / "scratch")
    try:
        here = _facts(_run(pool, tmp_path, probe_env, "facts"))
        there = _facts(_run(pool, tmp_path, probe_env, "facts", cwd=elsewhere))
    finally:
        pool.close()
    # An absolute PYTHONPATH: one interpreter for both folders; each run in its own.
    assert here["preloaded"] and there["preloaded"] and here["ppid"] == there["ppid"]
    assert (here["cwd"], there["cwd"]) == (str(tmp_path), str(elsewhere))


def test_a_pythonpath_relative_to_the_folder_ties_an_interpreter_to_it() -> None:
    # Python makes such entries absolute against the folder it starts in: a run in another
    # folder would have found other modules than the interpreter did.
    from traingate.pipeline.supervision.warm import folder_dependent

    assert folder_dependent("modules") and folder_dependent(f"/abs{os.pathsep}rel") and folder_dependent(f"/abs{os.pathsep}")
    assert not folder_dependent(None) and not folder_dependent(f"/abs{os.pathsep}/other")


def test_another_environment_or_a_dead_interpreter_starts_a_fresh_one(tmp_path: Path, probe_env: dict[str, str]) -> None:
    pool = WarmPool(tmp_path / "scratch")
    try:
        warm = _run(pool, tmp_path, probe_env, "facts")
        other = _run(pool, tmp_path, {**probe_env, "WARM_MARKER": "another"}, "facts")
        killed = _run(pool, tmp_path, probe_env, "kill-parent")
        fresh = _run(pool, tmp_path, probe_env, "facts")
        unpooled = _run(None, tmp_path, probe_env, "facts")
        # An interpreter whose start printed (or warned) would hide that from every fork's record.
        noisy = tmp_path / "noisy"
        noisy.mkdir()
        (noisy / "sitecustomize.py").write_text("import sys\nprint('said at start', file=sys.stderr)\n")
        printed = _run(pool, tmp_path, {**probe_env, "PYTHONPATH": f"{noisy}{os.pathsep}{probe_env['PYTHONPATH']}"}, "facts")
    finally:
        pool.close()
    assert _facts(warm)["preloaded"]
    # Another environment gets a warm interpreter of its own.
    assert _facts(other)["preloaded"] and _facts(other)["marker"] == "another" and _facts(other)["ppid"] != _facts(warm)["ppid"]
    # A child that kills its warm interpreter loses its status: the run ends as killed, at once.
    assert killed.returncode == -9 and not killed.timed_out
    assert not _facts(fresh)["preloaded"] and _facts(fresh)["ppid"] == os.getpid()
    assert not _facts(unpooled)["preloaded"]
    assert not _facts(printed)["preloaded"] and "said at start" in printed.stderr


def test_the_warm_start_is_on_by_default_and_turned_off_by_its_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    from traingate.pipeline.supervision.warm import enabled

    monkeypatch.delenv("TRAINGATE_WARM_START", raising=False)
    assert enabled() == (sys.version_info >= (3, 11))
    monkeypatch.setenv("TRAINGATE_WARM_START", "0")
    assert not enabled()


def test_an_agent_forked_from_the_agents_host_runs_its_runs_from_a_fork_of_its_own(tmp_path: Path, probe_env: dict[str, str]) -> None:
    # The gate's agents' host imports torch once with the runs' environment; each agent is a
    # fork of it with its own environment, handed a fork of its own for its runs: a child of the
    # agent (whose orphans come back to the agent), with the host's imports and environment.
    # The host also prepared what every agent imports and builds (`stages/agent/preload.py`);
    # the runs, target code, see none of the gate's modules. (A fresh host: the suite's import
    # server serves no PYTHONPATH; test_import_server.py checks a served host's modules.)
    (Path(probe_env["PYTHONPATH"]) / "warmagent.py").write_text(AGENT)
    agent_env = {**probe_env, "AGENT_SCRATCH": str(tmp_path / "agent-runs")}
    host = WarmPool(tmp_path / "host")
    host.host_agents(child_environment(probe_env), child_environment(agent_env), cwd=tmp_path)
    try:
        agent = run_child(python_argv("warmagent"), cwd=tmp_path, budget_s=60, scratch=tmp_path / "agent", env=agent_env, name="agent", warm=host)
    finally:
        host.close()
    assert agent.returncode == 0, agent.stderr
    facts = json.loads(agent.stdout)
    assert facts["handed"] and facts["torch"] and facts["frozen"]
    assert facts["prepared"] and facts["registry_built"]
    assert facts["interpreter_parent"] == facts["agent"]
    run = facts["run"]
    assert run["preloaded"] and run["ppid"] == facts["interpreter"] and run["marker"] == "the run's environment"
    assert run["gate_modules"] == []
    assert run["sid"] == run["pid"] and run["cwd"] == str(tmp_path)
    assert facts["started_here"] == []  # the agent started no interpreter of its own
