"""The command line: exit codes, config errors with a report, the JSON Schema."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, TRAINGATE, cli_in_process, run_gate


def test_config_error_exits_2_and_still_writes_a_report(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "pyproject.toml").write_text('[tool.traingate]\ntask = "T9"\nstages_to_run = 3\n')
    run = run_gate(target, tmp_path / "out")
    assert run.returncode == 2
    assert "pyproject.toml" in run.stderr and "tool.traingate.stages_to_run" in run.stderr
    assert run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "config-error" and finding["blocking"]
    assert finding["evidence"]["data"] == {"file": "pyproject.toml", "key": "tool.traingate.stages_to_run"}
    assert (run.out / "report.md").is_file()


def test_unknown_stage_is_a_usage_error(tmp_path: Path) -> None:
    run = run_gate(tmp_path, tmp_path / "out", "--stages", "execution,linting")
    assert run.returncode == 2
    assert "linting" in run.stderr


def test_schema_command_prints_the_report_schema() -> None:
    done = cli_in_process("schema")
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert schema["title"] == "PipelineReport"
    assert {"decision", "score", "stages", "environment"} <= set(schema["properties"])
    published = json.loads((REPO / "schema" / "report.schema.json").read_text())
    assert published == schema, "schema/report.schema.json is stale: regenerate it with `traingate schema`"


def test_help_explains_the_exit_codes() -> None:
    done = cli_in_process("run", "--help")
    assert done.returncode == 0
    assert "--baseline" in done.stdout and "--stages" in done.stdout


def _tiny_target(tmp_path: Path, pyproject: str = "") -> Path:
    target = tmp_path / "target"
    (target / "tests").mkdir(parents=True, exist_ok=True)
    (target / "tests" / "test_ok.py").write_text("def test_ok():\n    assert True\n")
    if pyproject:
        (target / "pyproject.toml").write_text(pyproject)
    return target


def _assert_one_line_usage_error(run, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("traingate: "), run.stderr
    assert "Traceback" not in run.stderr and run.stdout == ""  # no stage started
    for word in words:
        assert word in lines[0]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ('{"decision": "PASS"}', ("--baseline", "not a traingate report.json", "tool_version")),
        ("[1, 2, 3]", ("--baseline", "not a traingate report.json")),
        ("{not json", ("--baseline", "cannot read")),
    ],
)
def test_a_baseline_of_the_wrong_shape_is_refused_before_anything_runs(tmp_path: Path, content: str, words: tuple[str, ...]) -> None:
    baseline = tmp_path / "baseline.json"
    baseline.write_text(content)
    run = run_gate(_tiny_target(tmp_path), tmp_path / "out", "--baseline", str(baseline))
    _assert_one_line_usage_error(run, *words)
    assert not (tmp_path / "out").exists()


def test_an_unreadable_baseline_is_refused(tmp_path: Path) -> None:
    run = run_gate(_tiny_target(tmp_path), tmp_path / "out", "--baseline", str(tmp_path / "missing.json"))
    _assert_one_line_usage_error(run, "--baseline", "missing.json", "No such file")
    run = run_gate(_tiny_target(tmp_path), tmp_path / "out", "--baseline", str(tmp_path))
    _assert_one_line_usage_error(run, "--baseline", "Is a directory")


def test_a_real_report_is_accepted_as_a_baseline(tmp_path: Path) -> None:
    target = _tiny_target(tmp_path)
    first = run_gate(target, tmp_path / "first", "--stages", "execution")
    assert first.returncode == 0, first.stderr
    second = run_gate(target, tmp_path / "second", "--stages", "execution", "--baseline", str(tmp_path / "first" / "report.json"))
    assert second.returncode == 0, second.stderr
    # The one new finding: a baseline report that records no commit (the target is no git
    # repository) cannot have its configuration compared; medium, and it does not block.
    [new] = second.report["baseline"]["new_findings"]
    [finding] = [f for s in second.report["stages"] for f in s["findings"] if f["id"] == new]
    assert finding["rule"] == "verification-narrowed/not-compared" and not finding["blocking"]


def test_an_out_that_is_a_file_or_cannot_be_written_is_refused(tmp_path: Path) -> None:
    target = _tiny_target(tmp_path)
    a_file = tmp_path / "a-file"
    a_file.write_text("keep me\n")
    _assert_one_line_usage_error(run_gate(target, a_file), "--out", "not a folder")
    _assert_one_line_usage_error(run_gate(target, a_file / "sub"), "--out", "cannot write")
    assert a_file.read_text() == "keep me\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not stop root")
def test_a_read_only_out_is_refused(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        _assert_one_line_usage_error(run_gate(_tiny_target(tmp_path), locked / "out"), "--out", "cannot write")
    finally:
        locked.chmod(0o700)


def test_out_equal_to_the_target_root_is_refused(tmp_path: Path) -> None:
    target = _tiny_target(tmp_path)
    before = sorted(p.name for p in target.iterdir())
    _assert_one_line_usage_error(run_gate(target, target), "--out", "target's root")
    assert sorted(p.name for p in target.iterdir()) == before


def test_out_on_a_folder_of_the_target_with_its_own_files_is_refused(tmp_path: Path) -> None:
    target = _tiny_target(tmp_path)
    _assert_one_line_usage_error(run_gate(target, target / "tests"), "--out", "its own files")
    assert sorted(p.name for p in (target / "tests").iterdir()) == ["test_ok.py"]


@pytest.mark.parametrize("option", ["--task", "--version"])
@pytest.mark.parametrize("value", ["../..", "..", "a/b", ".hidden"])
def test_names_that_would_escape_the_reports_folder_are_refused(tmp_path: Path, option: str, value: str) -> None:
    done = subprocess.run(
        [*TRAINGATE, "run", str(_tiny_target(tmp_path)), option, value], capture_output=True, text=True, cwd=tmp_path
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert option in done.stderr and "not a valid name" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "traingate-reports").exists()


def test_a_task_that_would_escape_in_the_config_is_a_config_error_with_a_report(tmp_path: Path) -> None:
    target = _tiny_target(tmp_path, '[tool.traingate]\ntask = "../.."\n')
    done = subprocess.run([*TRAINGATE, "run", str(target)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1
    assert "tool.traingate.task" in done.stderr and "Traceback" not in done.stderr
    # The config-error report goes under the folder's own name, never two levels up.
    [written] = list(tmp_path.rglob("report.json"))
    assert written.parent.parent == tmp_path / "traingate-reports" / "target"
    assert json.loads(written.read_text())["stages"][0]["findings"][0]["category"] == "config-error"


@pytest.mark.parametrize(
    ("pyproject", "key"),
    [
        ("tool = 5\n", "tool"),
        ("[tool.traingate]\ntimeout_s = inf\n", "tool.traingate.timeout_s"),
        ("[tool.traingate]\ntimeout_s = nan\n", "tool.traingate.timeout_s"),
    ],
)
def test_malformed_configuration_is_one_line_exit_2_and_a_report(tmp_path: Path, pyproject: str, key: str) -> None:
    run = run_gate(_tiny_target(tmp_path, pyproject), tmp_path / "out")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [line] = run.stderr.strip().splitlines()
    assert key in line
    [finding] = run.findings()
    assert finding["category"] == "config-error" and finding["evidence"]["data"]["key"] == key


def test_a_bad_ci_policy_file_is_a_usage_error(tmp_path: Path) -> None:
    policy = tmp_path / "policy.toml"
    policy.write_text('block_on = ["severe"]\n')
    _assert_one_line_usage_error(run_gate(_tiny_target(tmp_path), tmp_path / "out", "--policy", str(policy)), "--policy", "block_on")
    _assert_one_line_usage_error(run_gate(_tiny_target(tmp_path), tmp_path / "out", "--policy", str(tmp_path / "none.toml")), "--policy", "cannot read")
