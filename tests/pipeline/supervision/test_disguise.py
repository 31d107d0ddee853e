"""The child-side modules under one run's name (`pipeline/supervision/disguise.py`, docs/edited-tests.md):
nothing in the copy, its names, the command lines or the environment names the gate, and the
copy is a plain copy of the files."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from traingate.pipeline.supervision import disguise
from traingate.pipeline.supervision.disguise import Disguise
from traingate.pipeline.supervision.isolation import python_argv
from traingate.pipeline.supervision.target_env import target_env
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.pipeline.model.config import TargetConfig
from traingate.stages.base import StageContext, run_entrypoint
from traingate.stages.performance.config import PerformanceConfig
from traingate.stages.performance.stage import _TimingDone, _timing_environment
from tests.paths import REPO

MARKER = "traingate"
LAUNCHER = "traingate.stages.execution.probe.pytest_launcher"


@pytest.fixture(scope="module")
def mask() -> Iterator[Disguise]:
    built = disguise.build()
    try:
        yield built
    finally:
        disguise.remove(built)


def test_the_copy_names_the_gate_nowhere(mask: Disguise) -> None:
    folder = Path(mask.folder)
    files = [p for p in folder.rglob("*") if p.is_file()]
    assert files and all(MARKER not in str(p.relative_to(folder)).lower() for p in files)
    assert all(MARKER not in p.read_bytes().decode("utf-8", "replace").lower() for p in files if p.suffix == ".py")
    assert all(MARKER not in name.lower() for name in [mask.package, mask.stacks_env, mask.tag_env, mask.folder])
    assert mask.holds(LAUNCHER) and not mask.holds("traingate.stages.agent") and not mask.holds("traingate.stages.correctness.stage")
    assert mask.module(LAUNCHER) == f"{mask.package}.execution.probe.pytest_launcher"


def test_the_copy_is_a_plain_copy_of_the_child_side(mask: Disguise) -> None:
    """Every child-side module is copied byte for byte; of the parent side, nothing."""
    copy = Path(mask.folder) / mask.package
    copied = sorted(p.relative_to(copy) for p in copy.rglob("*.py"))
    between = {Path("__init__.py"), *(Path(stage, "__init__.py") for stage in ("execution", "performance", "concurrency", "correctness"))}
    for relative in copied:
        if relative in between:  # the copy's own package and each stage's: empty
            assert (copy / relative).read_text() == ""
        else:
            assert (copy / relative).read_bytes() == (REPO / "stages" / relative).read_bytes(), relative
    names = {str(p) for p in copied}
    assert {"harness/entrypoint.py", "common/guard.py", "contract/messages.py", "contract/payloads/base.py", "execution/probe/pytest_launcher.py", "correctness/probe/distributed.py"} <= names
    assert not {"base.py", "agent/__main__.py", "correctness/stage.py", "correctness/spec.py"} & names


def test_two_runs_get_different_names() -> None:
    first, second = disguise.build(), disguise.build()
    try:
        assert first.package != second.package and first.stacks_env != second.stacks_env and first.folder != second.folder
        # Which copy a child starts from is its command's, so two runs' commands in one process keep theirs.
        one, other = python_argv(LAUNCHER, disguise=first).argv, python_argv(LAUNCHER, disguise=second).argv
        assert first.folder in one[2] and f"{first.package}.execution" in one[2] and second.folder not in one[2]
        assert second.folder in other[2] and f"{second.package}.execution" in other[2] and first.folder not in other[2]
    finally:
        disguise.remove(first)
        disguise.remove(second)



def test_the_copy_goes_to_memory_unless_a_temporary_folder_is_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy's 150 files go to a memory folder with room (their creation is most of the
    copy's cost on a disk), to the chosen folder when TMPDIR, TEMP or TMP names one, and to
    the default temporary folder when no memory folder is usable."""
    memory = tmp_path / "memory"
    memory.mkdir()
    monkeypatch.setattr(disguise, "MEMORY_FOLDERS", (str(tmp_path / "absent"), str(memory)))
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    assert disguise.copy_parent() == str(memory)
    built = disguise.build()
    try:
        assert Path(built.folder).parent == memory and (Path(built.folder) / built.package / "harness" / "entrypoint.py").is_file()
    finally:
        disguise.remove(built)
    assert not any(memory.iterdir())
    for name in ("TMPDIR", "TEMP", "TMP"):
        assert disguise.copy_parent({name: str(tmp_path)}) is None
    monkeypatch.setattr(disguise, "MEMORY_ROOM", 1 << 62)  # no folder has that much room
    assert disguise.copy_parent() is None
    monkeypatch.setattr(disguise, "MEMORY_FOLDERS", (str(tmp_path / "absent"),))
    monkeypatch.setattr(disguise, "MEMORY_ROOM", 0)
    assert disguise.copy_parent() is None


# Builds a copy in `parent` (argv[1]) as a gate run does, says where, and waits to be killed.
BUILDS_AND_WAITS = """
import sys, time
from traingate.pipeline.supervision import disguise
disguise.MEMORY_FOLDERS, disguise.MEMORY_ROOM = (sys.argv[1],), 0
print(disguise.build().folder, flush=True)
time.sleep(120)
"""


@pytest.mark.slow
def test_a_copy_whose_run_was_killed_outright_goes_at_the_next_build_and_no_other(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed with SIGKILL removes nothing; its copy, in memory, would stay until the
    machine restarts. The next build in that folder removes it: no process holds its lock.
    A live run's copy and a folder laid out otherwise are left alone."""
    parent = tmp_path / "memory"
    parent.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TMPDIR", "TEMP", "TMP")}
    with subprocess.Popen([sys.executable, "-c", BUILDS_AND_WAITS, str(parent)], stdout=subprocess.PIPE, text=True, env=env) as killed:
        assert killed.stdout is not None
        orphan = Path(killed.stdout.readline().strip())
        assert orphan.parent == parent and orphan.is_dir()
        assert disguise.sweep(parent) == []  # held: its run goes on
        killed.kill()
        killed.wait()
    (orphan / ".0a1b2c3d4e5f").write_text("# dump main pid 1\n")  # a stack file the run left there
    decoy = parent / "tmpdecoy"
    (decoy / "package" / "harness").mkdir(parents=True)
    for name in ("TMPDIR", "TEMP", "TMP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(disguise, "MEMORY_FOLDERS", (str(parent),))
    monkeypatch.setattr(disguise, "MEMORY_ROOM", 0)
    live = disguise.build()
    try:
        assert not orphan.exists() and Path(live.folder).is_dir() and decoy.is_dir()
        assert disguise.sweep(parent) == [] and Path(live.folder).is_dir()
    finally:
        disguise.remove(live)
    assert sorted(p.name for p in parent.iterdir()) == ["tmpdecoy"]


@pytest.mark.slow
def test_a_child_side_module_runs_from_the_copy_and_the_gate_keeps_its_own(mask: Disguise) -> None:
    command = python_argv("traingate.stages.contract.pytest_events", disguise=mask)
    child, agent = command.argv, python_argv("traingate.stages.agent", disguise=mask).argv
    names = (disguise.stacks_env(LAUNCHER, mask), disguise.tag_env(LAUNCHER, mask), disguise.stacks_env("traingate.stages.agent", mask))
    assert MARKER not in " ".join(child).lower() and MARKER not in " ".join(agent).lower()
    assert names == (mask.stacks_env, mask.tag_env, "TRAINGATE_STACKS_FILE")  # an agent is the gate's own process
    assert command.started_as == f"{mask.package}.contract.pytest_events"
    # The copy is chosen by the command, not by the process: without one the module runs as installed.
    assert "traingate.stages.contract.pytest_events" in python_argv("traingate.stages.contract.pytest_events").argv
    assert disguise.stacks_env(LAUNCHER, None) == "TRAINGATE_STACKS_FILE"
    # The copy imports (its imports are relative) and loads nothing of the real package; its
    # modules name the variables after the copy's package.
    check = (
        "; import sys, importlib; assert not [m for m in sys.modules if m.startswith('train' + 'gate')], sorted(sys.modules)"
        f"; stacks = importlib.import_module('{mask.package}.common.stacks'); assert (stacks.STACKS_ENV, stacks.RUN_TAG_ENV) == ({mask.stacks_env!r}, {mask.tag_env!r})"
    )
    probe = child[:2] + [child[2] + check]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=120, env=target_env({"PATH": "/usr/bin:/bin"}, "cpu"))
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_targets_environment_leaves_out_the_gates_settings() -> None:
    env = target_env({"TRAINGATE_POLICY": "ci.toml", "traingate_x": "1", "_": "/venv/bin/traingate", "HOME": "/home/u"}, "cpu")
    assert "HOME" in env and not [k for k in env if MARKER in k.lower() or k == "_"]


# OMP_WAIT_POLICY=PASSIVE, which the gate sets for the target's runs where the user's environment
# sets no policy, is read by OpenMP when torch starts it; the target's code then finds none.
READS_THE_POLICY = '''
import os


def main():
    import torch

    return {"policy": os.environ.get("OMP_WAIT_POLICY"), "threads": torch.get_num_threads()}
'''


def _policy_seen(tmp_path: Path, warm: bool) -> object:
    root = tmp_path / "target"
    root.mkdir()
    (root / "reads_env.py").write_text(READS_THE_POLICY)
    config = TargetConfig.model_validate({"entrypoint": {"call": "reads_env:main"}})
    ctx = StageContext(stage="execution", root=root, config=config, device="cpu", deadline=time.time() + 300, scratch=tmp_path / "s")
    ctx.warm = WarmPool(tmp_path / "w") if warm else None
    try:
        run = run_entrypoint(ctx, label="env")
    finally:
        if ctx.warm is not None:
            ctx.warm.close()
    assert run.ok and run.record is not None, run.child.stderr[-2000:]
    return run.record.returned


@pytest.mark.slow
@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "forked"])
def test_a_target_finds_no_openmp_wait_policy_it_did_not_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, warm: bool) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert _policy_seen(tmp_path, warm) == {"policy": None, "threads": torch.get_num_threads()}


@pytest.mark.slow
def test_a_wait_policy_the_user_set_is_the_targets_to_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert _policy_seen(tmp_path, warm=False) == {"policy": "active", "threads": torch.get_num_threads()}


def test_the_machine_record_still_names_the_wait_policy_the_runs_started_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    ctx = StageContext(stage="performance", root=tmp_path, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=tmp_path)
    # What the runs' OpenMP reads when it starts, and what the harness takes away after.
    assert ctx.child_env()["OMP_WAIT_POLICY"] == "PASSIVE" and ctx.read_at_start() == ["OMP_WAIT_POLICY"]
    assert _machine_policy(ctx) == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert ctx.read_at_start() == [] and _machine_policy(ctx) == "ACTIVE"


def _machine_policy(ctx: StageContext) -> str | None:
    """The wait policy the performance stage's machine record names (`_timing_environment`)."""
    machine = _timing_environment(ctx, _TimingDone(runs=[]), "cpu", None, PerformanceConfig()).timings.machine
    assert machine is not None
    return machine.omp_wait_policy
