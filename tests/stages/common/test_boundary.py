"""The boundary between the gate and the code under review: results come back over a pipe
with a per-run nonce, cross-checked against what the parent saw, and nothing a target can
find or rewrite turns a failure into a pass."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.supervision.isolation import ChildResult, run_child
from traingate.stages.common.stacks import crash_frames
from traingate.stages.base import StageContext
from traingate.stages.common import stacks
from traingate.stages.common.channel import ChannelError, first_notice, new_nonce, read_records, read_single
from traingate.stages.contract.pytest_events import PYTEST_EVENTS
from traingate.stages.execution.checks import suite_findings
from traingate.stages.execution.suite import SuiteRun, inconsistencies, parse_events
from tests.conftest import REPO, TARGETS, line_of

# -- the channel's format ------------------------------------------------------------------------


def envelope(nonce: str, seq: int, body: dict, kind: str = "harness-result") -> bytes:
    return json.dumps({"nonce": nonce, "seq": seq, "kind": kind, "body": body}).encode() + b"\n"


def test_one_record_with_the_nonce_is_accepted() -> None:
    assert read_single(envelope("n", 0, {"ok": True}), "n", "harness-result") == {"ok": True}
    assert read_single(b"", "n", "harness-result") is None


@pytest.mark.parametrize(
    ("data", "what"),
    [
        (b'{"ok": true}\n', "not a record of the harness"),
        (envelope("guess", 0, {"ok": True}), "nonce"),
        (envelope("n", 0, {"ok": False}) + envelope("n", 1, {"ok": True}), "2 records"),
        (envelope("n", 0, {"ok": True}) + b'{"ok": true}', "after the last record"),
        (envelope("n", 0, {"ok": True}) + envelope("n", 0, {"ok": True}), "sequence number 0"),
        (envelope("n", 0, {"ok": True}, kind="agent-reply"), "'agent-reply' record"),
    ],
)
def test_anything_but_one_record_of_the_harness_is_rejected(data: bytes, what: str) -> None:
    with pytest.raises(ChannelError, match=what):
        read_single(data, "n", "harness-result")


def test_a_forged_nonce_in_any_alphabet_is_a_channel_error() -> None:
    """Not a TypeError from comparing strings that are not ASCII: the run fails closed as for any other forgery."""
    with pytest.raises(ChannelError, match="nonce"):
        read_single(envelope("n\u00e9", 0, {"ok": True}), "n", "harness-result")


def test_one_bodiless_notice_may_come_before_the_record() -> None:
    notice = envelope("n", 0, {}, kind="machine-released")
    assert read_single(notice + envelope("n", 1, {"ok": True}, kind="agent-reply"), "n", "agent-reply", notice="machine-released") == {"ok": True}
    assert read_single(notice, "n", "agent-reply", notice="machine-released") is None  # the child died after its notice
    for data, what in [
        (notice + envelope("n", 1, {"ok": True}, kind="agent-reply"), "2 records"),  # not expected: no notice accepted
        (envelope("n", 0, {"ok": True}, kind="agent-reply") + envelope("n", 1, {}, kind="machine-released"), "2 records"),
    ]:
        with pytest.raises(ChannelError, match=what):
            read_single(data, "n", "agent-reply")
    with pytest.raises(ChannelError, match="with a body"):
        read_single(envelope("n", 0, {"x": 1}, kind="machine-released"), "n", "agent-reply", notice="machine-released")
    with pytest.raises(ChannelError, match="2 records"):  # a second notice is a record too many
        read_single(notice + envelope("n", 1, {}, kind="machine-released") + envelope("n", 2, {"ok": True}, kind="agent-reply"), "n", "agent-reply", notice="machine-released")


@pytest.mark.parametrize(
    ("data", "decided"),
    [
        (b"", None),
        (envelope("n", 0, {}, kind="machine-released")[:20], None),  # its line is not complete yet
        (envelope("n", 0, {}, kind="machine-released"), True),
        (envelope("n", 0, {}, kind="machine-released") + b'{"nonce"', True),
        (envelope("guess", 0, {}, kind="machine-released"), False),
        (envelope("n\u00e9", 0, {}, kind="machine-released"), False),
        (envelope("n", 1, {}, kind="machine-released"), False),
        (envelope("n", 0, {"x": 1}, kind="machine-released"), False),
        (envelope("n", 0, {"ok": True}, kind="agent-reply"), False),
        (b"garbage\n", False),
    ],
)
def test_a_notice_is_read_from_the_first_complete_line_only(data: bytes, decided: bool | None) -> None:
    assert first_notice(data, "n", "machine-released") is decided


def test_nonces_differ_per_run() -> None:
    assert len({new_nonce() for _ in range(50)}) == 50


def test_stream_drops_only_a_cut_off_last_record() -> None:
    data = envelope("n", 0, {"event": "start"}, "pytest-event") + b'{"nonce": "n", "se'
    assert [r.body for r in read_records(data, "n", allow_cut_tail=True)] == [{"event": "start"}]
    with pytest.raises(ChannelError):
        read_records(data, "n")


# -- run_child's stdin and channel ---------------------------------------------------------------


def _child(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "child.py"
    path.write_text("from traingate.stages.common import guard\nguard.install()\n" + textwrap.dedent(body))
    return [sys.executable, str(path)]


def test_request_on_stdin_and_result_over_the_channel(tmp_path: Path) -> None:
    argv = _child(tmp_path, """
        import json, os, sys
        request = json.loads(sys.stdin.read())
        # The descriptor's number reaches the child on stdin only, never through its environment.
        assert str(request["fd"]) not in os.environ.values()
        os.write(request["fd"], (json.dumps({"echo": request["word"]}) + "\\n").encode())
    """)
    result = run_child(
        argv, cwd=tmp_path, budget_s=30, scratch=tmp_path / "s", env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin_data=lambda fd: json.dumps({"fd": fd, "word": "hello"}).encode(), channel=True,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.channel) == {"echo": "hello"}
    assert result.channel_problem is None


def test_channel_is_complete_only_after_the_childs_descendants_are_dead(tmp_path: Path) -> None:
    """A grandchild holding the write end keeps writing after the child exits: what it wrote
    before the group was killed is there, and nothing after."""
    argv = _child(tmp_path, """
        import json, os, sys, time
        fd = json.loads(sys.stdin.read())["fd"]
        if os.fork() == 0:
            while True:
                os.write(fd, b"late\\n")
                time.sleep(0.05)
        time.sleep(0.3)
    """)
    result = run_child(
        argv, cwd=tmp_path, budget_s=30, scratch=tmp_path / "s", env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin_data=lambda fd: json.dumps({"fd": fd}).encode(), channel=True,
    )
    assert result.returncode == 0 and result.channel_problem is None
    assert set(result.channel.splitlines()) == {b"late"}


def test_os_exit_zero_is_located_until_the_harness_is_done(tmp_path: Path) -> None:
    argv = _child(tmp_path, """
        import os
        def finish_early():
            os._exit(0)
        finish_early()
    """)
    result = run_child(argv, cwd=tmp_path, budget_s=30, scratch=tmp_path / "s", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0
    frame = next(f for f in crash_frames(result.stacks) if f.path.endswith("child.py"))
    assert (frame.line, frame.function) == (line_of(Path(argv[-1]), "os._exit(0)"), "finish_early")

    argv = _child(tmp_path, """
        guard.exit_after_reporting(0)
    """)
    result = run_child(argv, cwd=tmp_path, budget_s=30, scratch=tmp_path / "s2", env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0 and crash_frames(result.stacks) == []


def test_stack_headers_are_written_and_parsed_from_one_definition() -> None:
    assert stacks.MAIN_HEADER.match(stacks.main_header(12, 0xABC).strip()).groups() == ("12", "0xabc")
    assert stacks.CRASH_MARK.match(stacks.self_signal_header("os._exit(0)", 12).strip())


# -- cross-checks of pytest's exit status against its events ------------------------------------


def _ctx(root: Path) -> StageContext:
    return StageContext(stage="execution", root=root, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=root / "scratch")


def _suite(events: list[dict], returncode: int) -> SuiteRun:
    child = ChildResult(argv=["python"], returncode=returncode, timed_out=False, duration_s=1.0, stdout="", stderr="")
    return SuiteRun(args=["tests"], config_file=None, child=child, events=[PYTEST_EVENTS.validate_python(e) for e in events], coverage_file=None)


_RAN = {"ran": True, "raised": None, "called": None}


def _test(nodeid: str, outcome: str = "passed") -> list[dict]:
    call = {"event": "report", "nodeid": nodeid, "when": "call", "outcome": outcome, "duration": 0.0, "observed": _RAN}
    if outcome == "failed":
        call["longrepr"] = "E   assert False"
    return [
        {"event": "test_start", "nodeid": nodeid, "path": "tests/test_a.py", "line": 1},
        {"event": "report", "nodeid": nodeid, "when": "setup", "outcome": "passed", "duration": 0.0, "observed": _RAN},
        call,
        {"event": "report", "nodeid": nodeid, "when": "teardown", "outcome": "passed", "duration": 0.0, "observed": _RAN},
    ]


def _run(nodeids: list[str], tests: list[dict], exitstatus: int, returncode: int) -> SuiteRun:
    start = {"event": "start", "pytest": "8.3", "rootdir": "/t", "inifile": None, "args": [], "pid": 1, "xdist_workers": None}
    events = [start, {"event": "collected", "count": len(nodeids), "deselected": 0, "nodeids": nodeids}, *tests]
    return _suite(events + [{"event": "finish", "exitstatus": exitstatus, "testscollected": len(nodeids), "testsfailed": 0, "stopped": None}], returncode)


@pytest.mark.parametrize(
    ("tests", "exitstatus", "returncode", "reason"),
    [
        (_test("t::a") + _test("t::b"), 1, 1, "exit-1-without-failures"),
        (_test("t::a", "failed") + _test("t::b"), 0, 0, "exit-0-with-failures"),
        (_test("t::a") + _test("t::b"), 0, 3, "pytest-exit-mismatch"),
        (_test("t::a"), 0, 0, "collected-test-without-outcome"),
    ],
)
def test_exit_status_that_contradicts_the_events_is_a_blocking_stage_error(tmp_path: Path, tests: list[dict], exitstatus: int, returncode: int, reason: str) -> None:
    run = _run(["t::a", "t::b"], tests, exitstatus, returncode)
    found = [f for f in suite_findings(_ctx(tmp_path), run, parse_events(run.events)) if f.category.value == "stage-error"]
    assert [f.evidence.data["reason"] for f in found] == [reason] and found[0].blocking
    if reason == "collected-test-without-outcome":
        assert "t::b" in found[0].problem


def test_consistent_runs_raise_nothing() -> None:
    passing = _run(["t::a"], _test("t::a"), 0, 0)
    assert inconsistencies(passing, parse_events(passing.events)) == []
    failing = _run(["t::a"], _test("t::a", "failed"), 1, 1)
    assert inconsistencies(failing, parse_events(failing.events)) == []


# -- end to end: forgeries from inside the target ------------------------------------------------


def _no_leftovers(pattern: str) -> None:
    """No process left running whose command line names this fixture target."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            assert pattern not in cmdline or int(entry.name) == os.getpid(), cmdline


@pytest.mark.slow
@pytest.mark.parametrize("case", ["forge_events_append", "forge_events_exit"])
def test_forged_pytest_events_block(gate, case: str) -> None:
    run = gate(case, "--stages", "execution")
    assert run.returncode == 1, run.stderr
    assert run.report["decision"] == "BLOCK"
    categories = run.categories("execution")
    assert categories & {"stage-error", "test-failure"}
    if case == "forge_events_append":
        [error] = run.findings("stage-error")
        assert error["blocking"] and error["evidence"]["data"]["reason"] == "untrusted-events"
    else:
        # The forging test ended the process: it fails, and the forged lines are rejected.
        assert any(f["blocking"] for f in run.findings("test-failure") + run.findings("stage-error"))
    _no_leftovers(case)


@pytest.mark.slow
def test_forged_smoke_result_is_a_crash_located_at_the_exit(gate) -> None:
    run = gate("forge_smoke_result", "--stages", "execution")
    assert run.returncode == 1, run.stderr
    [crash] = run.findings("entrypoint-crash")
    assert crash["blocking"]
    train = TARGETS / "forge_smoke_result" / "train.py"
    assert (crash["location"]["path"], crash["location"]["line"]) == ("train.py", line_of(train, "os._exit(0)"))
    smoke = run.stage("execution")["details"]["smoke"]["runs"][0]
    assert smoke["ok"] is False
    _no_leftovers("forge_smoke_result")


@pytest.mark.slow
def test_target_pipeline_package_never_reaches_the_agent(gate, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    markers = tmp_path / "markers"
    markers.mkdir()
    monkeypatch.setenv("FORGE_MARKER_DIR", str(markers))
    run = gate("forge_atexit_pipeline", "--stages", "execution")
    assert run.returncode == 1, run.stderr
    [failure] = [f for f in run.findings("test-failure") if "test_fails" in f["title"]]
    assert failure["blocking"]
    importers = [m.read_text() for m in markers.iterdir()]
    # The target's own tests import it (in the test process: the pytest launcher, started from
    # the run's disguised copy of the child-side modules, docs/edited-tests.md), no gate process does.
    assert importers and all(argv.endswith(".py") and "traingate" not in argv for argv in importers), importers
    assert not any("agent" in argv for argv in importers)


@pytest.mark.slow
def test_awkward_return_values_are_summarised_not_crashes(gate) -> None:
    run = gate("smoke_odd_returns", "--stages", "execution")
    assert "entrypoint-crash" not in run.categories(), run.findings()
    assert run.returncode == 0, run.report
    [smoke] = run.stage("execution")["details"]["smoke"]["runs"]
    assert smoke["ok"] is True
    assert len(smoke["returned"]) <= 500
    work = run.out / "work" / "execution"
    assert sum(p.stat().st_size for p in work.iterdir() if p.is_file()) < 1024 * 1024
