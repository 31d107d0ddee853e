"""The execution stage's pure parts: event parsing, skip grouping, fail-closed decisions on
synthetic runs, config pinning, entrypoint body lines, warning classification. No process
is started here."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.registry import parts
from traingate.pipeline.supervision.isolation import ChildResult
from traingate.stages.base import StageContext
from traingate.stages.execution.spec import ExecutionStage
from traingate.stages.execution.checks import suite_findings
from traingate.stages.execution.coverage import body_lines, entrypoint_source
from traingate.stages.execution.suite import SuiteRun, counts, decode_events, find_pytest_config, group_skips, parse_events, skip_reason
from traingate.stages.execution.deprecations import WarningSite, gather
from traingate.stages.common.channel import ChannelError
from traingate.stages.contract.messages import WarningRecord
from traingate.stages.contract.pytest_events import PYTEST_EVENTS, PytestEvent, WarningEvent
from traingate.stages.execution.probe.pytest_plugin import describe_exception


def ctx_for(root: Path) -> StageContext:
    return StageContext(stage="execution", root=root, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=root / "scratch")


def typed(events: list[dict]) -> list[PytestEvent]:
    """The events as the parent decodes them from the channel."""
    return [PYTEST_EVENTS.validate_python(e) for e in events]


def parse(events: list[dict]):
    return parse_events(typed(events))


def suite_run(events: list[dict], returncode: int | None = 0, stderr: str = "", stacks: str = "", timed_out: bool = False) -> SuiteRun:
    child = ChildResult(argv=["python"], returncode=returncode, timed_out=timed_out, duration_s=1.0, stdout="", stderr=stderr, stacks=stacks)
    return SuiteRun(args=["tests"], config_file=None, child=child, events=typed(events), coverage_file=None)


def start(nodeid: str, line: int = 3) -> dict:
    return {"event": "test_start", "nodeid": nodeid, "path": nodeid.split("::")[0], "line": line}


SAW_IT_RUN = {"ran": True, "raised": None, "called": None}  # the gate saw the phase run, raising nothing


def report(nodeid: str, when: str, outcome: str, **extra) -> dict:
    return {"event": "report", "nodeid": nodeid, "when": when, "outcome": outcome, "duration": 0.01, "observed": SAW_IT_RUN, **extra}


def exception(type_: str, message: str, frame: dict | None) -> dict:
    """describe_exception()'s fields."""
    return {"type": type_, "message": message, "traceback": "", "target_frame": frame, "environment": None}


def passed(nodeid: str) -> list[dict]:
    return [start(nodeid), *(report(nodeid, w, "passed") for w in ("setup", "call", "teardown"))]


def skipped(nodeid: str, reason: str, line: int = 7) -> list[dict]:
    skip = {"path": "tests/test_a.py", "line": line, "reason": f"Skipped: {reason}"}
    return [start(nodeid), report(nodeid, "setup", "skipped", skip=skip), report(nodeid, "teardown", "passed")]


SESSION = [{"event": "start", "pytest": "8.3", "rootdir": "/t", "inifile": None, "args": [], "pid": 1, "xdist_workers": None}]


def finish(code: int) -> list[dict]:
    return [{"event": "finish", "exitstatus": code, "testscollected": 0, "testsfailed": 0, "stopped": None}]


def collected(n: int, deselected: int = 0) -> list[dict]:
    return [{"event": "collected", "count": n, "deselected": deselected}]


# -- parsing events into outcomes -----------------------------------------------------------


def test_failed_call_keeps_the_target_frame_and_first_message_line():
    failure = exception("AssertionError", "assert 2 == 3\n where 2 = f()", {"path": "tests/test_a.py", "line": 9, "function": "test_x", "code": "assert f() == 3"})
    events = [*SESSION, *collected(1), start("tests/test_a.py::test_x"), report("tests/test_a.py::test_x", "setup", "passed"),
              report("tests/test_a.py::test_x", "call", "failed", failure=failure, longrepr="E   assert 2 == 3"),
              report("tests/test_a.py::test_x", "teardown", "passed"), *finish(1)]
    result = parse(events)
    (test,) = result.tests
    assert test.outcome == "failed"
    assert test.message == "AssertionError: assert 2 == 3"
    assert test.failure is not None and test.failure.target_frame is not None and test.failure.target_frame.line == 9


def test_fixture_error_is_an_error_not_a_failure():
    node = "tests/test_a.py::test_y"
    result = parse([*SESSION, start(node), report(node, "setup", "failed", longrepr="E   RuntimeError: no db"), report(node, "teardown", "passed"), *finish(1)])
    assert result.tests[0].outcome == "error"
    assert result.tests[0].message == "RuntimeError: no db"
    assert counts(result).errors == 1 and counts(result).failed == 0


def test_xfail_and_xpass_are_told_apart_from_skips():
    a, b = "tests/test_a.py::test_xf", "tests/test_a.py::test_xp"
    events = [*SESSION, start(a), report(a, "setup", "passed"), report(a, "call", "skipped", wasxfail="known"), report(a, "teardown", "passed"),
              start(b), report(b, "setup", "passed"), report(b, "call", "passed", wasxfail="flaky"), report(b, "teardown", "passed"), *finish(0)]
    outcomes = [t.outcome for t in parse(events).tests]
    assert outcomes == ["xfailed", "xpassed"]


def test_unfinished_test_is_crashed_without_finish_and_interrupted_with_it():
    node = "tests/test_a.py::test_dies"
    events = [*SESSION, start(node), report(node, "setup", "passed")]
    assert parse(events).tests[0].outcome == "crashed"
    assert parse(events + finish(2)).tests[0].outcome == "interrupted"


def test_a_cut_off_last_record_is_dropped():
    records = [{"nonce": "n1", "seq": i, "kind": "pytest-event", "body": body} for i, body in enumerate([*SESSION, *collected(2)])]
    data = "".join(json.dumps(r) + "\n" for r in records).encode() + b'{"nonce": "n1", "seq": 2, "kind": "pytest-ev'
    assert [e.event for e in decode_events(data, "n1")] == ["start", "collected"]
    assert decode_events(b"", "n1") == []


@pytest.mark.parametrize("body", [{"event": "forged"}, {**SESSION[0], "pid": "one"}, {**collected(2)[0], "extra": 1}, {"event": "finish", "exitstatus": 0}])
def test_a_record_not_in_the_plugins_shape_is_a_channel_problem(body: dict):
    data = (json.dumps({"nonce": "n1", "seq": 0, "kind": "pytest-event", "body": body}) + "\n").encode()
    with pytest.raises(ChannelError, match="record 0 is not a pytest event the plugin writes"):
        decode_events(data, "n1")


def test_skip_reasons_are_grouped_largest_first():
    events = [*SESSION]
    for i in range(3):
        events += skipped(f"tests/test_a.py::test_gpu[{i}]", "CUDA not available")
    events += skipped("tests/test_a.py::test_data", "needs the full dataset", line=20) + finish(0)
    groups = group_skips(parse(events).tests)
    assert [(g.reason, g.count) for g in groups] == [("CUDA not available", 3), ("needs the full dataset", 1)]
    assert groups[1].line == 20


@pytest.mark.parametrize(
    ("given", "reason"),
    [("Skipped: CUDA not available", "CUDA not available"), ("unconditional skip", "unconditional skip"), (None, "no reason given"), ("Skipped: ", "no reason given")],
)
def test_skip_reason_drops_pytests_prefix(given, reason):
    assert skip_reason(given) == reason


# -- fail closed ------------------------------------------------------------------------------


def categories(ctx: StageContext, run: SuiteRun) -> list[str]:
    return [f.category.value for f in suite_findings(ctx, run, parse_events(run.events))]


def test_all_skipped_is_no_tests_and_the_skips_are_listed(tmp_path: Path):
    ctx = ctx_for(tmp_path)
    run = suite_run([*SESSION, *collected(1), *skipped("tests/test_a.py::test_gpu", "CUDA not available"), *finish(0)])
    found = suite_findings(ctx, run, parse_events(run.events))
    assert sorted(f.category.value for f in found) == ["no-tests", "skipped-tests"]
    no_tests = next(f for f in found if f.category.value == "no-tests")
    assert no_tests.blocking and "all 1 tests were skipped" in no_tests.problem


def test_exit_zero_without_any_event_is_no_tests(tmp_path: Path):
    found = suite_findings(ctx_for(tmp_path), run := suite_run([], returncode=0), parse_events(run.events))
    assert [f.category.value for f in found] == ["no-tests"] and found[0].blocking


def test_all_deselected_is_no_tests(tmp_path: Path):
    run = suite_run([*SESSION, *collected(0, deselected=4), *finish(5)], returncode=5)
    found = suite_findings(ctx_for(tmp_path), run, parse_events(run.events))
    assert [f.category.value for f in found] == ["no-tests"]
    assert "all 4 collected tests were deselected" in found[0].problem


def test_missing_test_folder_is_no_tests(tmp_path: Path):
    run = suite_run([], returncode=4, stderr="ERROR: file or directory not found: tests\n")
    assert categories(ctx_for(tmp_path), run) == ["no-tests"]


def test_other_usage_error_is_a_stage_error(tmp_path: Path):
    run = suite_run([], returncode=4, stderr="ERROR: usage: python -m pytest [options]\npytest: error: unrecognized arguments: --cov\n")
    found = suite_findings(ctx_for(tmp_path), run, parse_events(run.events))
    assert [f.category.value for f in found] == ["stage-error"] and found[0].blocking
    assert "--cov" in found[0].problem


def test_conftest_import_error_is_a_critical_collection_error(tmp_path: Path):
    err = {"event": "conftest_error", "conftest": str(tmp_path / "tests/conftest.py"),
           **exception("ImportError", "no module named x", {"path": "tests/conftest.py", "line": 2, "function": "<module>", "code": "import x"})}
    found = suite_findings(ctx_for(tmp_path), run := suite_run([err], returncode=4), parse_events(run.events))
    assert [(f.category.value, f.severity.value, f.location.line) for f in found] == [("collection-error", "critical", 2)]


def test_internal_error_from_the_targets_hook_is_a_collection_error(tmp_path: Path):
    err = {"event": "internal_error", **exception("ValueError", "bad hook", {"path": "conftest.py", "line": 5, "function": "pytest_collection_modifyitems", "code": "raise ValueError"})}
    run = suite_run([*SESSION, err, *finish(3)], returncode=3)
    assert categories(ctx_for(tmp_path), run) == ["collection-error"]
    bare = {**err, "target_frame": None}
    assert categories(ctx_for(tmp_path), suite_run([*SESSION, bare, *finish(3)], returncode=3)) == ["stage-error"]


def test_run_stopped_by_a_hook_after_some_tests_is_a_failure(tmp_path: Path):
    stop = {"event": "interrupt", **exception("Exit", "enough", {"path": "conftest.py", "line": 8, "function": "pytest_runtest_logfinish", "code": "pytest.exit('enough')"})}
    run = suite_run([*SESSION, *collected(3), *passed("tests/test_a.py::test_1"), stop, *finish(0)], returncode=0)
    found = suite_findings(ctx_for(tmp_path), run, parse_events(run.events))
    assert [f.category.value for f in found] == ["test-failure"]
    assert "1 of 3" in found[0].title and found[0].location.line == 8 and found[0].blocking


def test_process_death_inside_a_test_fails_that_test(tmp_path: Path):
    node = "tests/test_a.py::test_exit"
    stacks = '# dump self-signal os._exit(3) pid 1\nStack (most recent call first):\n  File "%s", line 4 in test_exit\n' % (tmp_path / "tests/test_a.py")
    run = suite_run([*SESSION, *collected(2), start(node, line=3), report(node, "setup", "passed")], returncode=3, stacks=stacks)
    found = suite_findings(ctx_for(tmp_path), run, parse_events(run.events))
    assert [(f.category.value, f.location.path, f.location.line) for f in found] == [("test-failure", "tests/test_a.py", 4)]


def test_clean_run_has_no_findings(tmp_path: Path):
    run = suite_run([*SESSION, *collected(1), *passed("tests/test_a.py::test_1"), *finish(0)])
    assert categories(ctx_for(tmp_path), run) == []


# -- configuration pinning ---------------------------------------------------------------------------


def test_pytest_config_is_looked_for_inside_the_target_only(tmp_path: Path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "pyproject.toml").write_text("[tool.traingate]\ntimeout_s = 5\n")
    assert find_pytest_config(tmp_path, ["tests"]) is None  # no pytest section: an empty config is used
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\nmarkers = ['x']\n")
    assert find_pytest_config(tmp_path, ["tests", "-k", "fast"]) == tmp_path / "pyproject.toml"
    (tmp_path / "tests" / "pytest.ini").write_text("[pytest]\n")
    assert find_pytest_config(tmp_path, ["tests/test_a.py::test_x"]) == tmp_path / "tests" / "pytest.ini"


def test_setup_cfg_counts_only_with_its_pytest_section(tmp_path: Path):
    (tmp_path / "setup.cfg").write_text("[metadata]\nname = x\n")
    assert find_pytest_config(tmp_path, []) is None
    (tmp_path / "setup.cfg").write_text("[tool:pytest]\naddopts = -q\n")
    assert find_pytest_config(tmp_path, []) == tmp_path / "setup.cfg"


# -- the entrypoint's body ---------------------------------------------------------------------------


def test_body_lines_skip_docstring_and_nested_bodies(tmp_path: Path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "train.py").write_text(
        "import os\n"                      # 1
        "\n"                                # 2
        "def fit(n):\n"                     # 3
        '    """Docstring."""\n'            # 4
        "    def inner():\n"                # 5
        "        return 1\n"                # 6
        "    total = inner() + n\n"         # 7
        "    return total\n"                # 8
    )
    source = entrypoint_source(tmp_path, "pkg.train:fit")
    assert source is not None and source.rel == "pkg/train.py" and source.def_line == 3
    assert source.statements == {5, 7, 8}
    assert 6 not in source.span and 4 not in source.span
    assert entrypoint_source(tmp_path, "pkg.missing:fit") is None


def test_body_lines_of_a_multiline_statement_span_all_its_lines():
    import ast

    func = ast.parse("def f():\n    x = g(\n        1,\n    )\n").body[0]
    statements, span = body_lines(func)  # type: ignore[arg-type]
    assert statements == {2} and span == {2, 3, 4}


# -- warnings ---------------------------------------------------------------------------------------


def site(category: str, message: str, via_torch: bool = False, issued_at: str = "train.py:3") -> WarningSite:
    return WarningSite(category=category, message=message, path="train.py", line=3, function="fit", code="x", via_torch=via_torch, issued_at=issued_at)


def test_deprecated_torch_api_classification():
    assert site("FutureWarning", "`torch.cuda.amp.autocast(args...)` is deprecated. Please use ...").deprecated_torch_api
    assert site("DeprecationWarning", "old signature", via_torch=True).deprecated_torch_api
    assert site("UserWarning", "This overload is deprecated", issued_at="/venv/lib/site-packages/torch/nn/x.py:5").deprecated_torch_api
    assert not site("UserWarning", "CUDA is not available, disabling autocast (torch)").deprecated_torch_api
    assert not site("DeprecationWarning", "numpy.float is deprecated").deprecated_torch_api
    assert not site("FutureWarning", "pandas will change a default").deprecated_torch_api
    # Another package named after torch (setuptools' warning on importing pytorch_lightning 1.9):
    # not a PyTorch API.
    namespace = "Deprecated call to `pkg_resources.declare_namespace('pytorch_lightning')`."
    assert not site("DeprecationWarning", namespace, issued_at="/venv/lib/site-packages/pytorch_lightning/__init__.py:45").deprecated_torch_api
    assert not site("DeprecationWarning", "`torch_xla.experimental` is deprecated").deprecated_torch_api


def test_warnings_from_tests_and_smoke_merge_by_call_site(tmp_path: Path):
    frame = {"path": "train.py", "line": 3, "function": "fit", "code": "s = GradScaler()"}
    record = {"category": "FutureWarning", "message": "deprecated torch", "filename": "train.py", "lineno": 3, "target_frame": frame}
    event = WarningEvent.model_validate({**record, "when": "runtest", "nodeid": "tests/test_a.py::test_x", "via_torch": False})
    sites = gather(tmp_path, [event, event], [WarningRecord.model_validate(record)])
    assert len(sites) == 1 and sites[0].count == 3 and sites[0].sources == {"tests", "smoke"}


def test_syntax_error_is_located_in_the_file_that_does_not_parse(tmp_path: Path):
    bad = tmp_path / "model.py"
    bad.write_text("x = 1\ndef broken(:\n")
    try:
        compile(bad.read_text(), str(bad), "exec")
    except SyntaxError as exc:
        described = describe_exception(exc, tmp_path)
    assert described.target_frame is not None and (described.target_frame.path, described.target_frame.line) == ("model.py", 2)


def test_stage_declares_exactly_the_execution_categories():
    assert {c.value for c in parts(ExecutionStage()).categories} == {
        "test-failure", "collection-error", "no-tests", "skipped-tests", "test-selection", "test-disabled", "test-weakened", "test-environment",
        "entrypoint-crash", "entrypoint-untested", "deprecated-api",
    }


# -- entrypoint crashes without a traceback ----------------------------------------------------------


def write_entrypoint(root: Path) -> None:
    (root / "train.py").write_text("import os\n\n\ndef fit(steps=1):\n    os.kill(os.getpid(), 9)\n    return steps\n")


def crashed(returncode: int, stacks: str = "", result: dict | None = None):
    from traingate.stages.base import EntrypointRun

    child = ChildResult(argv=["python"], returncode=returncode, timed_out=False, duration_s=1.0, stdout="step 1\n", stderr="", stacks=stacks)
    return EntrypointRun(child=child, result=result)


def test_death_without_a_trace_is_located_at_the_entrypoint_def(tmp_path: Path):
    from traingate.stages.execution.smoke import crash_finding

    write_entrypoint(tmp_path)
    source = entrypoint_source(tmp_path, "train:fit")
    finding = crash_finding(ctx_for(tmp_path), crashed(-9), "The entrypoint smoke call train:fit", source)
    assert finding.category.value == "entrypoint-crash" and finding.blocking and finding.severity.value == "critical"
    assert (finding.location.path, finding.location.line, finding.location.function) == ("train.py", 4, "fit")
    assert "left no trace" in finding.problem and "SIGKILL" in finding.evidence.summary


def test_self_kill_with_a_dumped_stack_is_located_at_the_kill(tmp_path: Path):
    from traingate.stages.execution.smoke import crash_finding

    write_entrypoint(tmp_path)
    stacks = '# dump self-signal SIGKILL pid 7\nStack (most recent call first):\n  File "/venv/lib/guard.py", line 40 in kill\n  File "%s", line 5 in fit\n' % (tmp_path / "train.py")
    finding = crash_finding(ctx_for(tmp_path), crashed(-9, stacks), "The entrypoint smoke call train:fit", entrypoint_source(tmp_path, "train:fit"))
    assert (finding.location.path, finding.location.line) == ("train.py", 5)
    assert "left no trace" not in finding.problem
    assert finding.evidence.data["code"] == "os.kill(os.getpid(), 9)"


def test_syntax_error_in_the_entrypoint_module_is_located_at_the_bad_line(tmp_path: Path):
    from traingate.stages.execution.smoke import crash_finding

    (tmp_path / "train.py").write_text("def fit(:\n    pass\n")
    exc = {"type": "SyntaxError", "message": "invalid syntax (train.py, line 1)", "traceback": "...", "frames": [], "target_frame": None}
    run = crashed(0, result={"ok": False, "exception": exc, "phase": "import", "returned": None, "duration_s": 0.1})
    finding = crash_finding(ctx_for(tmp_path), run, "The entrypoint smoke call train:fit", entrypoint_source(tmp_path, "train:fit"))
    assert (finding.location.path, finding.location.line) == ("train.py", 1)
    assert "importing its module" in finding.problem


def _stopped_suite(test_s: float, duration_s: float, stepped_s_before_end: float | None = None) -> list:
    """A suite of 10 tests stopped at its budget after 4 finished, each taking `test_s`; the
    fifth, where given, still stepping an optimizer `stepped_s_before_end` before the end."""
    ids = [f"tests/test_a.py::test_{i}" for i in range(10)]
    events: list[dict] = [*SESSION, {"event": "collected", "count": 10, "deselected": 0, "nodeids": ids}]
    for nodeid in ids[:4]:
        events += [start(nodeid), *({**report(nodeid, when, "passed"), "duration": test_s / 3} for when in ("setup", "call", "teardown"))]
    events.append(start(ids[4]))
    ended = 1_000_000.0
    if stepped_s_before_end is not None:
        events.append({"event": "stepping", "nodeid": ids[4], "optimizer_steps": 900, "at": ended - stepped_s_before_end})
    run = suite_run(events, returncode=-9, timed_out=True)
    run = SuiteRun(args=run.args, config_file=None, child=replace(run.child, duration_s=duration_s), events=run.events, coverage_file=None, ended_at=ended)
    return suite_findings(ctx_for(Path("/t")), run, parse_events(run.events))


def test_a_suite_stopped_inside_a_test_still_training_is_an_overrun():
    """One long test that trains, stopped by the budget: no test finished for most of the run,
    but the running test was still making optimizer steps to the end."""
    [found] = [f for f in _stopped_suite(test_s=0.1, duration_s=110.0, stepped_s_before_end=0.5) if f.category.value in ("hang", "budget-overrun")]
    assert found.category.value == "budget-overrun" and "made 900 optimizer step(s)" in found.problem and "test_4" in found.title
    # Its steps stopped long before the end: a hang.
    [stuck] = [f for f in _stopped_suite(test_s=0.1, duration_s=110.0, stepped_s_before_end=80.0) if f.category.value in ("hang", "budget-overrun")]
    assert stuck.category.value == "hang"


def test_a_suite_still_running_tests_at_its_budget_is_an_overrun_not_a_hang():
    [found] = [f for f in _stopped_suite(test_s=25.0, duration_s=110.0) if f.category.value in ("hang", "budget-overrun")]
    assert found.category.value == "budget-overrun" and found.blocking
    assert "ran 4 of 10 collected test(s)" in found.problem and "was still making progress" in found.title
    assert "raise `timeout_s`" in found.fix.lower()
    # The same suite, its fifth test waiting for most of the run: a hang.
    [stuck] = [f for f in _stopped_suite(test_s=0.1, duration_s=110.0) if f.category.value in ("hang", "budget-overrun")]
    assert stuck.category.value == "hang"
