"""Unit checks: target text made fit for reports, and which test failures are the environment's."""

from __future__ import annotations

import errno
import socket
from pathlib import Path

import pytest

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Severity
from traingate.stages.concurrency.determinism import Divergence
from traingate.pipeline.model.text import clip_text, first_line, strip_ansi
from traingate.stages.execution.probe.pytest_plugin import environment_cause
from traingate.stages.execution.rules import TEST_FAILURE


def test_escape_codes_are_stripped():
    assert strip_ansi("\x1b[1mbold\x1b[0m and \x1b[31;1mred\x1b[m \x1b]8;;http://x\x07link\x1b]8;;\x07") == "bold and red link"


def test_multi_line_text_is_cut_at_line_boundaries_and_says_what_was_left_out():
    text = "first line of the message\nsecond line here\n" + "\n".join(f"row {i} with several words" for i in range(50))
    clipped = clip_text(text, 80)
    lines = clipped.splitlines()
    assert lines[:2] == ["first line of the message", "second line here"]
    assert all(line in text.splitlines() for line in lines[:-1])  # only whole lines
    assert lines[-1] == f"[… {52 - (len(lines) - 1)} more lines left out]"


def test_an_over_long_line_is_cut_between_words():
    line = first_line("\n  " + " ".join(["token"] * 100), 50)
    assert line.endswith(" …") and line[:-2].split(" ") == ["token"] * len(line[:-2].split(" "))


def test_findings_never_carry_escape_codes():
    f = Finding.create(
        stage="execution", category=TEST_FAILURE, severity=Severity.HIGH, title="\x1b[1mt\x1b[0m", location=None,
        problem="p \x1b[31mred\x1b[0m", impact="i", fix="f",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="\x1b[1ms\x1b[0m", traceback="E   \x1b[1massert\x1b[0m"), block_on={Severity.HIGH},
    )
    assert "\x1b" not in f.model_dump_json()


def test_a_returned_table_is_named_by_field_and_differing_line():
    frame_a = "   loss  acc\n0  0.50  0.9\n1  0.25  0.8\n...[2 rows x 2 columns]... [90 more characters cut]"
    frame_b = frame_a.replace("0.25", "0.26")
    d = Divergence("returned", None, frame_a, frame_b, key="history")
    text = d.describe()
    assert text == "returned `history`: line 3 of its text differs: '1  0.25  0.8' vs '1  0.26  0.8'"
    assert d.shown_values() == ["1  0.25  0.8", "1  0.26  0.8"]


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def test_network_errors_are_the_environments(tmp_path: Path):
    assert environment_cause(_raised(socket.gaierror(-2, "Name or service not known")), tmp_path)["kind"] == "network"
    assert environment_cause(_raised(ConnectionRefusedError(errno.ECONNREFUSED, "refused")), tmp_path)["kind"] == "network"
    assert environment_cause(_raised(OSError(errno.ENETUNREACH, "unreachable")), tmp_path)["kind"] == "network"
    # A library's own error raised from the socket error counts too.
    try:
        try:
            socket.getaddrinfo("example.invalid", 80)
        except OSError as inner:
            raise RuntimeError("could not download") from inner
    except RuntimeError as wrapped:
        assert environment_cause(wrapped, tmp_path)["kind"] == "network"
    # Not the network: a missing file, an assertion made while handling a network error.
    assert environment_cause(_raised(FileNotFoundError(errno.ENOENT, "no such file")), tmp_path) is None
    try:
        try:
            socket.getaddrinfo("example.invalid", 80)
        except OSError:
            assert 1 == 2
    except AssertionError as failed:
        assert environment_cause(failed, tmp_path) is None


def test_missing_packages_are_the_environments_unless_the_module_is_the_targets(tmp_path: Path):
    with pytest.raises(ModuleNotFoundError) as missing:
        import traingate_no_such_package.sub  # noqa: F401
    assert environment_cause(missing.value, tmp_path) == {
        "kind": "missing-package", "module": "traingate_no_such_package", "package": "traingate_no_such_package",
        "detail": "No module named 'traingate_no_such_package'",
    }
    (tmp_path / "traingate_no_such_package").mkdir()
    assert environment_cause(missing.value, tmp_path) is None  # the target's own package: a code defect


def test_a_child_run_sees_nothing_of_an_enclosing_pytest_run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # Target code that trains less under PYTEST_CURRENT_TEST must not do so because the gate
    # itself runs inside a test job; every child run (smoke, profile, suite) gets this environment.
    from traingate.pipeline.model.config import TargetConfig
    from traingate.stages.base import StageContext
    from traingate.pipeline.supervision.target_env import FOREIGN_PYTEST_ENV

    for name in FOREIGN_PYTEST_ENV:
        monkeypatch.setenv(name, "outer")
    monkeypatch.setenv("KEPT_VARIABLE", "kept")
    ctx = StageContext(stage="execution", root=tmp_path, config=TargetConfig(), device="cpu", deadline=0.0, scratch=tmp_path)
    env = ctx.child_env(EXTRA="1")
    assert not FOREIGN_PYTEST_ENV & set(env) and "PYTEST_CURRENT_TEST" in FOREIGN_PYTEST_ENV
    assert env["KEPT_VARIABLE"] == "kept" and env["EXTRA"] == "1" and env["CUDA_VISIBLE_DEVICES"] == "" and env["PYTHONDONTWRITEBYTECODE"] == "1"
