"""A framework's own fit or train call as the entrypoint (`call = "minifit:Trainer.fit"` with
the objects a setup builds), with no wrapper module under the target root. `minifit`
(tests/framework_site) stands in for an installed framework of Lightning's shape."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, line_of, start_cli
from tests.markdown_tables import report_folder_problems
from tests.entrypoint_targets import config_error
from tests.paths import FRAMEWORK_SITE
from traingate.pipeline.gate.config_file import load_config


def with_framework(env: dict[str, str] | None = None) -> dict[str, str]:
    base = dict(env if env is not None else os.environ)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(FRAMEWORK_SITE), base.get("PYTHONPATH", "")) if p)
    return base


def framework_gate(case: str, factory: pytest.TempPathFactory) -> GateRun:
    import json

    out = factory.mktemp(case) / "out"
    done = start_cli(["run", str(TARGETS / case), "--out", str(out), "--stages", "execution,correctness"], env=with_framework(), timeout=300)
    assert not report_folder_problems(out)
    return GateRun(done.returncode, json.loads((out / "report.json").read_text()), out, done.stdout, done.stderr)


@pytest.fixture(scope="module")
def softmax(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return framework_gate("entry_framework", tmp_path_factory)


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return framework_gate("entry_framework_clean", tmp_path_factory)


@pytest.mark.slow
def test_a_defect_in_the_users_training_step_is_found_at_its_line_through_the_frameworks_fit(softmax: GateRun):
    assert (softmax.returncode, softmax.report["decision"]) == (1, "BLOCK"), softmax.stdout + softmax.stderr
    [finding] = softmax.findings("loss-input-mismatch")
    model = TARGETS / "entry_framework" / "model.py"
    assert (finding["location"]["path"], finding["location"]["line"]) == ("model.py", line_of(model, "# marker: loss"))
    [smoke_run] = softmax.stage("execution")["details"]["smoke"]["runs"]
    assert smoke_run["ok"] is True


@pytest.mark.slow
def test_the_clean_control_passes_with_every_step_observed(clean: GateRun):
    assert (clean.returncode, clean.report["decision"]) == (0, "PASS"), clean.stdout + clean.stderr
    assert [f["category"] for f in clean.findings()] == ["no-tests"]  # tests = false: info only
    # Two epochs of 10 batches each (max_batches = 10 cuts the 64-batch loader).
    assert {m["id"]: m["value"] for m in clean.stage("correctness")["metrics"]}["steps.observed"] == 20


def test_a_framework_call_is_checked_as_an_installed_module_without_importing_it(monkeypatch: pytest.MonkeyPatch):
    import sys

    monkeypatch.syspath_prepend(str(FRAMEWORK_SITE))
    config, _ = load_config(TARGETS / "entry_framework")
    assert config.entrypoint is not None and config.entrypoint.call == "minifit:Trainer.fit"
    assert "minifit" not in sys.modules


def test_a_module_neither_under_the_root_nor_installed_is_a_configuration_error(tmp_path: Path):
    error = config_error(tmp_path, 'call = "nosuchframework.trainer:Trainer.fit"\nsetup = "s:build"\n', {"s.py": "def build():\n    return {}\n"})
    assert error.key == "traingate.entrypoint.call"
    assert "no installed module of that name" in error.message


# -- the real framework, where it is installed ------------------------------------------------


@pytest.mark.slow
def test_lightnings_own_trainer_fit_runs_every_stage_and_each_sees_every_step(shared_gate):
    pytest.importorskip("pytorch_lightning")
    run, _ = shared_gate("entry_lightning")
    assert (run.returncode, run.report["decision"]) == (0, "PASS"), run.stdout
    assert [f["category"] for f in run.findings()] == ["no-tests"]
    metrics = {s["name"]: {m["id"]: m["value"] for m in s["metrics"]} for s in run.report["stages"]}
    # Three epochs of 8 batches (max_batches = 8): Lightning's steps, as every stage counts them.
    assert metrics["performance"]["steps.profiled"] == 24
    assert metrics["concurrency"]["steps.observed"] == metrics["correctness"]["steps.observed"] == 24


@pytest.mark.slow
def test_a_leak_in_a_lightning_module_is_found_at_its_line(shared_gate):
    pytest.importorskip("pytorch_lightning")
    run, _ = shared_gate("entry_lightning_leak", "--stages", "performance")
    assert (run.returncode, run.report["decision"]) == (1, "BLOCK"), run.stdout
    [leak] = run.findings("memory-leak")
    model = TARGETS / "entry_lightning_leak" / "model.py"
    assert (leak["location"]["path"], leak["location"]["line"]) == ("model.py", line_of(model, "# marker: leak"))
    assert "self.step_losses" in leak["title"]
