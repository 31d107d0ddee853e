"""The choice of the test whose training is observed, and the parts that carry it, in process
(the gate runs are in tests/e2e/test_observed_tests.py)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from traingate.pipeline.gate import observed_tests
from traingate.pipeline.gate.config_file import ConfigError, load_config
from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.model.schema import (
    Category,
    Decision,
    Environment,
    Evidence,
    EvidenceKind,
    Finding,
    ObservedTraining,
    PipelineReport,
    Severity,
    StageReport,
    StageStatus,
    TargetInfo,
    TestRecord,
)
from traingate.stages.base import StageContext
from traingate.stages.execution.observed import MIN_OBSERVED_STEPS, choose, training_tests
from traingate.stages.execution.replay import NotReplayed, ReplayPlan
from traingate.stages.agent.observed_test import location_of_test, observed_test_tree


def _record(nodeid: str, steps: int, outcome: str = "passed", duration: float = 1.0) -> TestRecord:
    return TestRecord(nodeid=nodeid, outcome=outcome, path=nodeid.split("::")[0], optimizer_steps=steps, duration_s=duration)


def _ctx(tmp_path: Path, config: TargetConfig | None = None, baseline: PipelineReport | None = None) -> StageContext:
    return StageContext(stage="execution", root=tmp_path, config=config or TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=tmp_path / "s", baseline=baseline)


def _baseline(test: str | None) -> PipelineReport:
    observed = ObservedTraining(test=test, optimizer_steps=8, reason="", min_steps=MIN_OBSERVED_STEPS) if test else None
    return PipelineReport(
        tool_version="0", task="t", version="v1", target=TargetInfo(path="."), environment=Environment(python="3", torch=None, device="cpu", device_name="cpu"),
        started_at="", duration_s=0, decision=Decision.PASS, score=100, stages=[], observed_training=observed,
    )


def test_the_most_steps_first_then_the_shorter_and_only_tests_that_passed() -> None:
    records = [
        _record("t.py::few", 3), _record("t.py::slow", 20, duration=5.0), _record("t.py::fast", 20, duration=1.0),
        _record("t.py::failed", 99, outcome="failed"), _record("t.py::none", 0),
    ]
    assert [t.nodeid for t in training_tests(records)] == ["t.py::fast", "t.py::slow", "t.py::few"]


def test_the_choice_and_its_reason(tmp_path: Path) -> None:
    observed, files = choose(_ctx(tmp_path), [_record("t.py::a", 2), _record("t.py::b", 12)], None)
    assert observed is not None and observed.test == "t.py::b" and observed.optimizer_steps == 12 and files == {}
    assert "most optimizer steps (12)" in observed.reason and [c.nodeid for c in observed.candidates] == ["t.py::b", "t.py::a"]


def test_fewer_steps_than_a_verdict_needs_is_not_measured(tmp_path: Path) -> None:
    observed, _ = choose(_ctx(tmp_path), [_record("t.py::a", MIN_OBSERVED_STEPS - 1)], None)
    assert observed is not None and observed.test is None and observed.optimizer_steps == MIN_OBSERVED_STEPS - 1
    assert observed.reason.startswith("not measured: the test that trained most, t.py::a")
    nothing, _ = choose(_ctx(tmp_path), [_record("t.py::a", 0)], None)
    assert nothing is not None and nothing.test is None and nothing.optimizer_steps is None


def test_with_an_entrypoint_configured_nothing_is_chosen(tmp_path: Path) -> None:
    config = TargetConfig(entrypoint=EntrypointConfig(call="train:train"))
    assert choose(_ctx(tmp_path, config), [_record("t.py::a", 12)], None) == (None, {})


def test_the_baselines_test_is_observed_again_in_its_baseline_form_when_edited(tmp_path: Path) -> None:
    plan = ReplayPlan(commit="c", files=["tests/test_a.py"], tests=[], overlay={"tests/test_a.py": "old", "tests/conftest.py": None}, changed={"tests/test_a.py": ["tests/test_a.py"]})
    records = [_record("tests/test_a.py::fit", 1), _record("tests/test_b.py::decoy", 500)]
    observed, files = choose(_ctx(tmp_path, baseline=_baseline("tests/test_a.py::fit")), records, plan)
    assert observed is not None and observed.test == "tests/test_a.py::fit" and observed.baseline_form
    assert files == {"tests/test_a.py": "old", "tests/conftest.py": None}
    # Not edited: observed again as this version has it; not readable: said so.
    observed, files = choose(_ctx(tmp_path, baseline=_baseline("tests/test_b.py::decoy")), records, plan)
    assert observed is not None and not observed.baseline_form and files == {}
    observed, _ = choose(_ctx(tmp_path, baseline=_baseline("tests/test_a.py::fit")), records, NotReplayed("commit c is not in this clone", "c"))
    assert observed is not None and "commit c is not in this clone" in observed.reason
    # A baseline that observed nothing: this version's own choice.
    observed, _ = choose(_ctx(tmp_path, baseline=_baseline(None)), records, plan)
    assert observed is not None and observed.test == "tests/test_b.py::decoy"


def _execution(observed: ObservedTraining | None, files: dict[str, str | None] | None = None) -> StageReport:
    return StageReport(name="execution", status=StageStatus.PASSED, score=100, duration_s=1, summary="", observed_training=observed, observed_files=files or {})


def test_the_gate_hands_the_test_to_the_stages_that_run_the_training_function() -> None:
    observed = ObservedTraining(test="t.py::fit", optimizer_steps=8, reason="r", min_steps=3)
    reports = [_execution(observed, {"t.py": "old"})]
    config = observed_tests.stage_config(TargetConfig(), True, reports)
    assert config.entrypoint is not None and config.entrypoint.test == "t.py::fit" and config.entrypoint.test_files == {"t.py": "old"}
    assert config.entrypoint.label == "pytest t.py::fit (its baseline form)"
    assert observed_tests.stage_config(TargetConfig(), False, reports).entrypoint is None  # the execution stage itself
    configured = TargetConfig(entrypoint=EntrypointConfig(call="train:train"))
    assert observed_tests.stage_config(configured, True, reports) is configured
    assert observed_tests.not_measured(TargetConfig(), True, reports) is None
    too_few = [_execution(ObservedTraining(test=None, optimizer_steps=1, reason="not measured: one step", min_steps=3))]
    assert observed_tests.not_measured(TargetConfig(), True, too_few) == "not measured: one step"
    assert observed_tests.not_measured(TargetConfig(), True, [_execution(ObservedTraining(test=None, reason="none", min_steps=3))]) is None


def test_findings_name_the_test_without_changing_their_id() -> None:
    finding = Finding.create(
        stage="correctness", category=Category("stale-gradients"), severity=Severity.HIGH,
        title="t", location=None, problem="p", impact="i", fix="f", evidence=Evidence(kind=EvidenceKind.OBSERVED, data={"n": 1}), block_on=[Severity.HIGH],
    )
    config = TargetConfig(entrypoint=EntrypointConfig(test="t.py::fit"))
    [named] = observed_tests.with_test_named([finding], config)
    assert named.id == finding.id and named.evidence.data == {"n": 1, "training_test": "t.py::fit"} and named.blocking
    assert observed_tests.with_test_named([finding], TargetConfig()) == [finding]


def test_the_configuration_cannot_name_the_test(tmp_path: Path) -> None:
    (tmp_path / "traingate.toml").write_text('[entrypoint]\ntest = "tests/test_a.py::fit"\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert "set by the gate only" in str(info.value)


def test_the_test_runs_pinned_to_the_target_and_in_its_baseline_form_in_a_view(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("import os\n\n\nclass TestFit:\n    def test_fit(self):\n        pass\n")
    (tmp_path / "train.py").write_text("x = 1\n")
    nodeid = "tests/test_a.py::TestFit::test_fit"
    assert location_of_test(tmp_path, nodeid).model_dump() == {"path": "tests/test_a.py", "line": 5, "function": "test_fit"}
    assert location_of_test(tmp_path, "tests/test_a.py::gone[1]").line is None
    config = TargetConfig(entrypoint=EntrypointConfig(test=nodeid, test_files={"tests/test_a.py": "old\n"}))
    with observed_test_tree(_ctx(tmp_path, config)) as tree:
        assert tree is not None and tree.root != tmp_path and tree.args[0] == nodeid
        assert (tree.root / "tests" / "test_a.py").read_text() == "old\n" and (tree.root / "train.py").is_symlink()
        assert f"--rootdir={tree.root}" in tree.args and "-c" in tree.args
        view = tree.root
    assert not view.exists() and (tmp_path / "tests" / "test_a.py").read_text().startswith("import os")
    with observed_test_tree(_ctx(tmp_path)) as nothing:
        assert nothing is None
