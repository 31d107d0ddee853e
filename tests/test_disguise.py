"""The child-side modules under one run's names (`pipeline.disguise`, docs/edited-tests.md):
nothing in the copy, its names, the command lines or the environment names the gate."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from traingate.pipeline.supervision import disguise
from traingate.pipeline.supervision.disguise import Disguise
from traingate.stages.contract.target_env import target_env

MARKER = "traingate"


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
    assert len(mask.modules) == len(set(mask.modules.values()))
    assert all(MARKER not in name.lower() for name in [*mask.modules.values(), mask.stacks_env, mask.tag_env, mask.folder])
    assert "traingate.stages.harness.pytest_launcher" in mask.modules


def test_two_runs_get_different_names() -> None:
    first, second = disguise.build(), disguise.build()
    try:
        assert first.package != second.package and first.stacks_env != second.stacks_env
        assert set(first.modules.values()).isdisjoint(second.modules.values())
    finally:
        disguise.remove(first)
        disguise.remove(second)


@pytest.mark.slow
def test_a_child_side_module_runs_from_the_copy_and_the_gate_keeps_its_own(mask: Disguise) -> None:
    disguise.activate(mask)
    try:
        child = disguise.module_argv("traingate.stages.contract.pytest_events")
        agent = disguise.module_argv("traingate.stages.agent")
        names = (disguise.stacks_env(), disguise.tag_env(), disguise.stacks_env("traingate.stages.agent"))
    finally:
        disguise.activate(None)
    assert MARKER not in " ".join(child).lower() and MARKER not in " ".join(agent).lower()
    assert names == (mask.stacks_env, mask.tag_env, "TRAINGATE_STACKS_FILE")  # an agent is the gate's own process
    assert disguise.argv_module(child) == "traingate.stages.contract.pytest_events"
    # The copy imports (its imports rewritten to the copy's names) and loads nothing of the real package.
    probe = child[:2] + [child[2] + "; import sys; assert not [m for m in sys.modules if m.startswith('train' + 'gate')], sorted(sys.modules)"]
    done = subprocess.run(probe, capture_output=True, text=True, timeout=120, env=target_env({"PATH": "/usr/bin:/bin"}, "cpu"))
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_targets_environment_leaves_out_the_gates_settings() -> None:
    env = target_env({"TRAINGATE_POLICY": "ci.toml", "traingate_x": "1", "_": "/venv/bin/traingate", "HOME": "/home/u"}, "cpu")
    assert "HOME" in env and not [k for k in env if MARKER in k.lower() or k == "_"]
