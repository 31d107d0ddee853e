"""`traingate history DIR`: a task's versions in one table, each against the one before."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import cli_in_process
from tests.report_builders import measured, report, stage, write
from traingate.pipeline.model.history import load_history
from traingate.pipeline.model.registry import history_metrics
from traingate.pipeline.model.schema import Metric, Severity
from traingate.stages.performance.rules import HOST_SYNC, INPUT_STALL, MEMORY_LEAK


def history(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_in_process("history", *args)


def _perf_metrics(step_ms: float, growth: float, speedup: float) -> list[Metric]:
    return [
        Metric(id="step_time.median.fp32", name="step time, median (fp32)", value=step_ms, unit="ms"),
        Metric(id="step_time.median.amp", name="step time, median (amp)", value=step_ms / speedup, unit="ms"),
        Metric(id="memory.held_growth", name="memory held between steps, growth", value=growth, unit="bytes/step"),
        Metric(id="amp.speedup", name="AMP speedup", value=speedup, unit="x"),
    ]


def _versions(folder: Path) -> None:
    """Three versions whose folder names sort differently from their dates."""
    leak = measured("performance", MEMORY_LEAK, Severity.HIGH, "loop.py", "cache")
    sync = measured("performance", HOST_SYNC, Severity.MEDIUM, "loop.py", "loss.item()")
    stall = measured("performance", INPUT_STALL, Severity.MEDIUM, "data.py", "loader")
    versions = [
        ("z-first", "v6", "2026-11-01T09:00:00+00:00", [leak, sync], _perf_metrics(12.0, 4096.0, 1.1)),
        ("a-second", "v7", "2026-11-02T09:00:00+00:00", [sync, stall], _perf_metrics(10.0, 0.0, 1.6)),
        ("m-third", "v8", "2026-11-03T09:00:00+00:00", [stall], []),
    ]
    for name, version, started, findings, metrics in versions:
        write(report([stage("performance", findings, metrics)], version=version, started_at=started), folder / name / "report.json")


def test_versions_are_ordered_by_date_and_compared_with_the_previous_one(tmp_path: Path) -> None:
    _versions(tmp_path / "T1")
    (tmp_path / "T1" / "notes").mkdir()  # a folder without a report is not a version
    rows = load_history(tmp_path / "T1", history_metrics()).rows
    assert [r.version for r in rows] == ["v6", "v7", "v8"]
    assert [(r.new, r.resolved, r.persisting) for r in rows] == [(None, None, None), (1, 1, 1), (0, 1, 1)]
    assert [r.decision for r in rows] == ["BLOCK", "PASS", "PASS"]
    def value(row: int, column: str) -> tuple[float | None, str | None]:
        found = rows[row].metric(column)
        assert found is not None, column
        return found.value, found.id

    # The stages' history metrics: the performance stage's step time (its full-precision run's), memory growth, AMP speedup.
    assert value(0, "Step time") == (12.0, "step_time.median.fp32")
    assert value(1, "Memory growth") == (0.0, "memory.held_growth") and value(1, "AMP speedup") == (1.6, "amp.speedup")
    assert value(2, "Step time") == (None, None) and value(2, "AMP speedup") == (None, None)


def test_history_prints_a_table_and_mermaid_charts(tmp_path: Path) -> None:
    _versions(tmp_path / "T1")
    done = history(str(tmp_path / "T1"))
    assert done.returncode == 0, done.stderr
    md = done.stdout
    table = [line for line in md.splitlines() if line.startswith("| v")]
    assert [line.split(" | ")[0] for line in table] == ["| v6 (`z-first/`)", "| v7 (`a-second/`)", "| v8 (`m-third/`)"]
    assert "⛔ BLOCK" in table[0] and "4096 B/step" in table[0] and "1.1x" in table[0] and "12 ms (fp32)" in table[0]
    assert md.count("xychart-beta") == 2
    assert 'x-axis ["v6", "v7", "v8"]' in md and "bar [" in md
    # The step-time chart leaves out the version that measured none.
    assert 'x-axis ["v6", "v7"]' in md and "line [12, 10]" in md

    out = tmp_path / "history.md"
    assert history(str(tmp_path / "T1"), "--out", str(out)).returncode == 0
    assert out.read_text() == md


def test_a_folder_without_reports_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "empty" / "v1").mkdir(parents=True)
    done = history(str(tmp_path / "empty"))
    assert done.returncode == 2 and "no <version>/report.json" in done.stderr
