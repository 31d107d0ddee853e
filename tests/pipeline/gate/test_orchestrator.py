"""The orchestrator fails closed: every way a stage can go wrong ends in BLOCK."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.gate.orchestrator import RunRequest, agent_host, run_pipeline
from traingate.pipeline.model.schema import Decision, StageStatus
from traingate.pipeline.supervision import import_server
from tests.conftest import REPO
from tests.fake_stages import build


@pytest.fixture(autouse=True)
def _importable_fakes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))


def _run(tmp_path: Path, stage: str, timeout_s: float = 60):
    request = RunRequest(
        root=tmp_path, task="T", version="v", stages=[stage], out=tmp_path / "out", device="cpu",
        registry_factory="tests.fake_stages:build",
    )
    return run_pipeline(request, TargetConfig(timeout_s=timeout_s), build())


def test_a_suite_alone_gets_no_agents_host_where_no_import_server_serves(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One stage, a test suite, no entrypoint: the agents' host is worth a fork of an import
    server (tests/stages/execution/test_suite_accounting.py), not an `import torch` of its own.
    With no server named, or one that does not answer, there is none and nothing is left."""
    request = RunRequest(root=tmp_path, task="T", version="v", stages=["execution"], out=tmp_path / "out", device="cpu")
    monkeypatch.delenv(import_server.SERVER_ENV, raising=False)
    assert agent_host(request, TargetConfig(tests=["tests"])) is None
    monkeypatch.setenv(import_server.SERVER_ENV, str(tmp_path / "no-server"))
    assert agent_host(request, TargetConfig(tests=["tests"])) is None
    assert not (tmp_path / "out" / "work" / "agents").exists()


def test_clean_stage_passes(tmp_path: Path) -> None:
    report = _run(tmp_path, "clean")
    assert report.decision is Decision.PASS
    assert report.score == 100
    assert report.stages[0].status is StageStatus.PASSED


def test_overrunning_stage_is_killed_at_its_budget_with_stacks(tmp_path: Path) -> None:
    # The stage registry's first import in this process (seconds on a busy machine) is not the stage's time.
    TargetConfig(timeout_s=4), build()
    started = time.monotonic()
    report = _run(tmp_path, "sleeper", timeout_s=4)
    elapsed = time.monotonic() - started
    assert elapsed < 4 + 2, "the stage outlived its budget"
    assert report.stages[0].duration_s <= 4.05
    stage = report.stages[0]
    assert report.decision is Decision.BLOCK
    [hang] = stage.findings
    assert hang.category.value == "hang" and hang.blocking
    # The main thread's stack names the frame where it waits.
    assert 'fake_stages.py", line' in (hang.evidence.traceback or "")
    assert "in run" in (hang.evidence.traceback or "")


@pytest.mark.parametrize("stage", ["raiser", "liar", "trespasser", "dier"])
def test_broken_stage_is_a_blocking_stage_error(tmp_path: Path, stage: str) -> None:
    report = _run(tmp_path, stage)
    assert report.decision is Decision.BLOCK
    assert report.score == 0
    [finding] = report.stages[0].findings
    assert report.stages[0].status is StageStatus.ERROR
    assert finding.category.value == "stage-error" and finding.blocking
