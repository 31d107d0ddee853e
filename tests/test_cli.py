"""The command line: exit codes, config errors with a report, the JSON Schema."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, TRAINGATE, run_gate


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
    done = subprocess.run([*TRAINGATE, "schema"], capture_output=True, text=True, cwd=REPO, check=True)
    schema = json.loads(done.stdout)
    assert schema["title"] == "PipelineReport"
    assert {"decision", "score", "stages", "environment"} <= set(schema["properties"])
    published = json.loads((REPO / "schema" / "report.schema.json").read_text())
    assert published == schema, "schema/report.schema.json is stale: regenerate it with `traingate schema`"


def test_help_explains_the_exit_codes() -> None:
    done = subprocess.run([*TRAINGATE, "run", "--help"], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0
    assert "--baseline" in done.stdout and "--stages" in done.stdout
