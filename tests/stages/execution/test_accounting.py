"""The accounting's pure parts: when a logged outcome contradicts what the gate saw, how options
are named, and what a baseline test with no record here became."""

from __future__ import annotations

from pathlib import Path

import pytest

from traingate.pipeline.model.schema import PipelineReport, TestRecord
from traingate.stages.contract.pytest_events import PYTEST_EVENTS, ReportEvent, SelectionEvent
from traingate.stages.execution.accounting import Selection, repo_test_files
from traingate.stages.execution.accounting_checks import _gone, baseline_records
from traingate.stages.execution.suite import parse_events, phase_rewrite


def _phase(outcome: str, raised: dict | None = None, called: bool | None = None, made: str | None = None, **extra: object) -> dict:
    observed = {"ran": True, "raised": raised, "called": called}
    return {"nodeid": "t.py::test_a", "when": "call", "outcome": outcome, "duration": 0.0, "observed": observed, "made_outcome": made or outcome, **extra}


ASSERTION = {"type": "AssertionError", "message": "no", "kind": "other", "by_marker": False, "site": None}


@pytest.mark.parametrize(
    ("phase", "rewritten"),
    [
        (_phase("failed", ASSERTION), False),
        (_phase("passed", ASSERTION, made="failed"), True),
        (_phase("skipped", ASSERTION, wasxfail="known"), False),  # an xfail that failed as expected
        (_phase("skipped", ASSERTION), True),  # a failure turned into a skip
        (_phase("passed", None, called=True), False),
        (_phase("passed", None, called=False), True),  # the test function never ran
        (_phase("skipped", {**ASSERTION, "kind": "skip"}), False),
        (_phase("passed", {**ASSERTION, "kind": "skip"}), True),
        ({"nodeid": "t.py::test_a", "when": "call", "outcome": "passed", "duration": 0.0, "observed": None, "made_outcome": None}, True),  # a made-up report
        (_phase("failed", ASSERTION, teststatus="passed"), True),
        (_phase("failed", ASSERTION, teststatus="failed"), False),
    ],
)
def test_phase_rewrite(phase: dict, rewritten: bool) -> None:
    assert (phase_rewrite("call", ReportEvent.model_validate(phase)) is not None) is rewritten


def test_a_rewritten_test_counts_failed_and_keeps_its_evidence() -> None:
    events = [
        {"event": "start", "pytest": "8.3", "rootdir": "/t", "inifile": None, "args": [], "pid": 1, "xdist_workers": None},
        {"event": "collected", "count": 1, "deselected": 0, "nodeids": ["t.py::test_a"]},
        {"event": "test_start", "nodeid": "t.py::test_a", "path": "t.py", "line": 3},
        {"event": "report", **_phase("passed", None, when="setup")},
        {"event": "report", **_phase("passed", ASSERTION, made="failed")},
        {"event": "report", **_phase("passed", None, when="teardown")},
        {"event": "finish", "exitstatus": 0, "testscollected": 1, "testsfailed": 0, "stopped": None},
    ]
    [test] = parse_events([PYTEST_EVENTS.validate_python(e) for e in events]).tests
    assert test.outcome == "failed" and "AssertionError" in test.message
    assert test.rewrites[0].made == "failed"


def _selection(effective: dict, from_addopts: dict | None = None, from_args: dict | None = None) -> SelectionEvent:
    return SelectionEvent(addopts=[], effective=effective, from_addopts=from_addopts or {}, from_args=from_args or {}, target_hooks=[])


def test_options_are_named_as_a_reader_writes_them(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\nmarkers = []\naddopts = \"-x -k 'not slow'\"\n")
    event = _selection({"keyword": "not slow", "maxfail": 1, "deselect": ["a.py::t", "b.py::u"]}, {"keyword": "not slow", "maxfail": 1}, {"deselect": ["a.py::t", "b.py::u"]})
    selection = Selection(event, tmp_path, "pyproject.toml")
    assert selection.describe("keyword") == "-k 'not slow'"
    assert selection.describe("maxfail") == "-x"
    assert selection.describe("deselect") == "--deselect a.py::t --deselect b.py::u"
    source, where = selection.source("keyword")
    assert "addopts" in source and where is not None and where.line == 3
    assert "`tests`" in selection.source("deselect")[0]
    assert "conftest" in Selection(_selection({"markexpr": "x"}), tmp_path, None).source("markexpr")[0]


def test_a_missing_test_is_deleted_or_left_out(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_kept():\n    pass\n")
    record = TestRecord(nodeid="tests/test_a.py::test_gone", outcome="passed", path="tests/test_a.py")
    assert _gone(tmp_path, record, ["tests"])[0] == "deleted from tests/test_a.py"
    moved_out = TestRecord(nodeid="tests/test_a.py::test_kept", outcome="passed", path="tests/test_a.py")
    assert _gone(tmp_path, moved_out, ["other"])[0].startswith("not collected")
    assert "is gone" in _gone(tmp_path, TestRecord(nodeid="tests/test_b.py::test_x", outcome="passed"), ["tests"])[0]


def test_repo_test_files_skip_tool_folders(tmp_path: Path) -> None:
    for path in ("tests/test_a.py", "pkg/b_test.py", ".venv/lib/test_x.py", "node_modules/test_y.py", "tests/helper.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("def test_x():\n    pass\n")
    assert repo_test_files(tmp_path) == ["pkg/b_test.py", "tests/test_a.py"]


def _report(stages: list[dict]) -> PipelineReport:
    return PipelineReport.model_validate({
        "tool_version": "0", "task": "t", "version": "v1", "target": {"path": "."}, "started_at": "", "duration_s": 1.0, "decision": "PASS", "score": 100,
        "environment": {"python": "3.11", "torch": None, "device": "cpu", "device_name": "cpu"},
        "stages": [{"status": "passed", "score": 100, "duration_s": 1.0, "summary": "", **stage} for stage in stages],
    })


def test_a_baseline_without_records_is_not_compared() -> None:
    assert baseline_records(None)[0] is None
    records, why = baseline_records(_report([{"name": "execution", "tests": []}]))
    assert records is None and "no per-test records" in why
    assert baseline_records(_report([{"name": "performance"}]))[1] == "the baseline report has no execution stage"
    good = _report([{"name": "execution", "tests": [{"nodeid": "t.py::test_a", "outcome": "passed"}]}])
    assert [r.nodeid for r in baseline_records(good)[0] or []] == ["t.py::test_a"]
