"""One run of the observed test as the entrypoint: its outcome is handed back as soon as pytest
has run the test (setup, call, teardown, the session's fixtures torn down with it), and
pytest's end of session is skipped; what decides the outcome is what it was before.

Each case is a small target with one test, run by the harness in a child process as the
stages run it (`run_entrypoint` with the test as the entrypoint).
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import EntrypointRun, StageContext, run_entrypoint
from traingate.stages.agent.observed_test import observed_test_note

CONFTEST = '''
    import pathlib

    import pytest


    @pytest.fixture(scope="session")
    def session_resource():
        yield "held"
        pathlib.Path("session-teardown.txt").write_text("torn down")
        if pathlib.Path("fail-teardown").exists():
            raise RuntimeError("the session fixture's teardown failed")


    def pytest_sessionfinish(session):
        pathlib.Path("session-finish.txt").write_text("finished")
'''

TESTS = '''
    def test_trains(session_resource):
        assert session_resource == "held"


    def test_fails(session_resource):
        assert 1 + 1 == 3, "the test's own failure"
'''


def _target(root: Path, *, fail_teardown: bool = False) -> Path:
    (root / "tests").mkdir(parents=True)
    (root / "tests" / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (root / "tests" / "test_fit.py").write_text(textwrap.dedent(TESTS))
    if fail_teardown:
        (root / "fail-teardown").write_text("")
    return root


def _run(root: Path, nodeid: str, warm: WarmPool | None) -> EntrypointRun:
    config = TargetConfig(entrypoint=EntrypointConfig(test=nodeid))
    ctx = StageContext(stage="correctness", root=root, config=config, device="cpu", deadline=time.time() + 120, scratch=root.parent / "scratch", warm=warm)
    return run_entrypoint(ctx, label="observed")


def test_a_test_that_passed_is_handed_back_after_its_teardown_and_the_session_end_is_skipped(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    root = _target(tmp_path / "repo")
    run = _run(root, "tests/test_fit.py::test_trains", warm_pool)
    assert run.ok, (run.result, run.child.stderr)
    assert (root / "session-teardown.txt").read_text() == "torn down"  # the session's fixtures are the test's
    assert not (root / "session-finish.txt").exists()  # pytest's end of session never ran
    assert "passed" not in run.child.stdout  # nor its summary


def test_a_failing_test_is_the_calls_exception_located_in_the_test(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    run = _run(_target(tmp_path / "repo"), "tests/test_fit.py::test_fails", warm_pool)
    assert not run.ok and run.record is not None and run.record.exception is not None
    assert run.record.exception.type == "AssertionError" and "the test's own failure" in run.record.exception.message
    frame = run.record.exception.target_frame
    assert frame is not None and frame.path == "tests/test_fit.py" and frame.line == 7


def test_a_session_teardown_that_fails_fails_the_run(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    run = _run(_target(tmp_path / "repo", fail_teardown=True), "tests/test_fit.py::test_trains", warm_pool)
    assert not run.ok and run.record is not None and run.record.exception is not None
    assert "the session fixture's teardown failed" in run.record.exception.message


def test_a_test_not_collected_is_not_run_and_says_so(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    run = _run(_target(tmp_path / "repo"), "tests/test_fit.py::test_missing", warm_pool)
    assert not run.ok and run.record is not None and run.record.exception is not None
    assert run.record.exception.type == "TestNotRun" and "not collected" in run.record.exception.message


def test_the_checks_a_test_cannot_run_say_not_measured_and_what_they_need() -> None:
    note = observed_test_note("tests/test_fit.py::test_trains", "a run under torchrun")
    assert note.startswith("not measured: the training observed is a test (tests/test_fit.py::test_trains)")
    assert "configured entrypoint" in note
