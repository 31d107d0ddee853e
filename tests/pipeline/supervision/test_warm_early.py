"""A warm interpreter started early (`WarmPool.start_early`, `stages.base.start_warm_early`) is
the one the later run with its environment forks from: its imports overlapped the work before."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.supervision.isolation import child_environment
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import StageContext, start_warm_early
from tests.pipeline.supervision.warm_probe import PROBE, probe_facts as _facts, run_probe as _run

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the warm start is Linux's")


@pytest.fixture
def probe_env(tmp_path: Path) -> dict[str, str]:
    folder = tmp_path / "modules"
    folder.mkdir()
    (folder / "warmprobe.py").write_text(PROBE)
    return {**os.environ, "PYTHONPATH": str(folder), "WARM_MARKER": "the rerun's environment"}


def test_the_run_forks_from_the_interpreter_started_early_for_its_environment(tmp_path: Path, probe_env: dict[str, str]) -> None:
    pool = WarmPool(tmp_path / "scratch")
    try:
        pool.start_early(child_environment(probe_env), tmp_path)
        pool.start_early(child_environment(probe_env), tmp_path)  # one an environment, however often asked
        [early] = pool.interpreters()
        facts = _facts(_run(pool, tmp_path, probe_env, "facts"))
        assert pool.interpreters() == [early]
    finally:
        pool.close()
    assert facts["preloaded"] and facts["ppid"] == early.pid and facts["marker"] == "the rerun's environment"


def test_a_stage_starts_one_early_only_with_warm_interpreters_and_a_second_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = StageContext(stage="concurrency", root=tmp_path, config=TargetConfig(), device="cpu", deadline=0.0, scratch=tmp_path / "scratch")
    assert not start_warm_early(ctx, ctx.child_env(PYTHONHASHSEED="1"))  # no warm interpreters: every run starts fresh
    started: list[dict[str, str]] = []
    ctx.warm = WarmPool(tmp_path / "scratch")
    monkeypatch.setattr(ctx.warm, "start_early", lambda env, cwd: started.append(env))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    assert not start_warm_early(ctx, ctx.child_env(PYTHONHASHSEED="1")) and not started  # one core: it would slow the run it overlaps
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert start_warm_early(ctx, ctx.child_env(PYTHONHASHSEED="1"))
    # The environment the run will get from `run_child`, so the run finds this interpreter.
    assert started == [child_environment(ctx.child_env(PYTHONHASHSEED="1"))] and started[0]["PYTHONHASHSEED"] == "1"
