"""`traingate history DIR`: one task's versions side by side, each against the one before it.

DIR holds one folder per version (`traingate-reports/T035/v6`, `.../v7`), each with the
`report.json` of a run; versions are ordered by `started_at`. Findings are followed by id and
metrics by metric id, so reworded titles and labels never break the comparison.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from traingate.pipeline.model.schema import PipelineReport

# The metrics the table shows, by id; step time prefers the full-precision run.
STEP_TIME_IDS = ("step_time.median.fp32", "step_time.median.amp")
STEP_TIME_PREFIX = "step_time.median."
MEMORY_GROWTH_ID = "memory.held_growth"
AMP_SPEEDUP_ID = "amp.speedup"
TESTS_PASSED_ID = "tests.passed"
TESTS_COLLECTED_ID = "tests.collected"


class HistoryError(Exception):
    """The folder holds no readable reports; one line."""


@dataclass(frozen=True)
class VersionRow:
    """One version of the task, compared with the version before it."""

    version: str
    folder: str
    started_at: str
    decision: str
    score: int
    device: str
    findings: int
    blocking: int
    new: int | None  # None for the first version: nothing to compare with
    resolved: int | None
    persisting: int | None
    step_time_ms: float | None
    step_time_id: str | None
    memory_growth_bytes_per_step: float | None
    amp_speedup: float | None
    tests_passed: int | None = None  # None: the execution stage did not run a suite
    tests_collected: int | None = None


@dataclass(frozen=True)
class History:
    task: str
    rows: list[VersionRow]
    skipped: list[str]  # sub-folders without a usable report.json, with the reason


def load_history(folder: Path) -> History:
    if not folder.is_dir():
        raise HistoryError(f"{folder} is not a folder")
    reports: list[tuple[str, PipelineReport]] = []
    skipped: list[str] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        path = sub / "report.json"
        if not path.is_file():
            continue
        try:
            reports.append((sub.name, PipelineReport.model_validate(json.loads(path.read_text(encoding="utf-8")))))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError, ValidationError) as exc:
            skipped.append(f"{sub.name}: {str(exc).splitlines()[0]}")
    if not reports:
        raise HistoryError(f"{folder} holds no <version>/report.json" + (f" that can be read ({'; '.join(skipped)})" if skipped else ""))
    reports.sort(key=lambda item: (item[1].started_at, item[0]))
    tasks = sorted({r.task for _, r in reports})
    rows: list[VersionRow] = []
    previous: set[str] | None = None
    for name, report in reports:
        ids = {f.id for f in report.findings()}
        rows.append(_row(name, report, ids, previous))
        previous = ids
    return History(task=", ".join(tasks), rows=rows, skipped=skipped)


def _row(folder: str, report: PipelineReport, ids: set[str], previous: set[str] | None) -> VersionRow:
    metrics = {m.id: m.value for s in report.stages for m in s.metrics if m.id}
    step_id = next((i for i in STEP_TIME_IDS if i in metrics), None) or next((i for i in sorted(metrics) if i.startswith(STEP_TIME_PREFIX)), None)
    return VersionRow(
        version=report.version,
        folder=folder,
        started_at=report.started_at,
        decision=report.decision.value,
        score=report.score,
        device=report.environment.device,
        findings=len(ids),
        blocking=sum(f.blocking for f in report.findings()),
        new=None if previous is None else len(ids - previous),
        resolved=None if previous is None else len(previous - ids),
        persisting=None if previous is None else len(ids & previous),
        step_time_ms=_number(metrics.get(step_id)) if step_id else None,
        step_time_id=step_id,
        memory_growth_bytes_per_step=_number(metrics.get(MEMORY_GROWTH_ID)),
        amp_speedup=_number(metrics.get(AMP_SPEEDUP_ID)),
        tests_passed=_count(metrics.get(TESTS_PASSED_ID)),
        tests_collected=_count(metrics.get(TESTS_COLLECTED_ID)),
    )


def _count(value: object) -> int | None:
    number = _number(value)
    return None if number is None else int(number)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
