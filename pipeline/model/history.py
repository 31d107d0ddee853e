"""`traingate history DIR`: one task's versions side by side, each against the one before it.

DIR holds one folder per version (`traingate-reports/T035/v6`, `.../v7`), each with the
`report.json` of a run; versions are ordered by `started_at`. Findings are followed by id and
metrics by metric id, so reworded titles and labels never break the comparison. Which metrics
the table shows is the registered stages' to say (`Stage.history_metrics`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from traingate.pipeline.model.schema import PipelineReport


@dataclass(frozen=True, kw_only=True)
class HistoryMetric:
    """A metric a stage shows in `traingate history` (`Stage.history_metrics`): a column of the
    table and, with `chart`, a chart by version."""

    column: str  # the table's header, "Step time"
    ids: tuple[str, ...]  # the metric ids it reads, the first a report has
    prefix: str = ""  # else the first id (in sorted order) starting with this
    unit: str = ""  # after the value: " ms", "x"
    variant: bool = False  # the id's last part after the value, in parentheses: "12 ms (fp32)"
    total: str = ""  # the id of a total: the cell reads "value of total", "—" without the total
    chart: str = ""  # the chart's y axis ("step time (ms)"); "" for no chart
    chart_title: str = ""  # what the chart's title says it shows ("median step time (ms)")
    stage: str = ""  # the stage that declares it (the registry fills it in)


@dataclass(frozen=True)
class MetricValue:
    """One history metric of one version: its value and the id it was read from (None: the
    report has none), and its total when it has one."""

    metric: HistoryMetric
    value: float | None
    id: str | None
    total: float | None = None


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
    metrics: tuple[MetricValue, ...] = ()  # the registered stages' history metrics, in their order

    def metric(self, column: str) -> MetricValue | None:
        """The value of the metric shown under `column`."""
        return next((m for m in self.metrics if m.metric.column == column), None)


@dataclass(frozen=True)
class History:
    task: str
    rows: list[VersionRow]
    skipped: list[str]  # sub-folders without a usable report.json, with the reason


def load_history(folder: Path, metrics: Sequence[HistoryMetric]) -> History:
    """The task's versions in `folder`, with `metrics` (the registered stages': `registry.history_metrics`)."""
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
        rows.append(_row(name, report, ids, previous, metrics))
        previous = ids
    return History(task=", ".join(tasks), rows=rows, skipped=skipped)


def _row(folder: str, report: PipelineReport, ids: set[str], previous: set[str] | None, shown: Sequence[HistoryMetric]) -> VersionRow:
    metrics = {m.id: m.value for s in report.stages for m in s.metrics if m.id}
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
        metrics=tuple(_value(metric, metrics) for metric in shown),
    )


def _value(metric: HistoryMetric, metrics: Mapping[str, object]) -> MetricValue:
    found = next((i for i in metric.ids if i in metrics), None)
    if found is None and metric.prefix:
        found = next((i for i in sorted(metrics) if i.startswith(metric.prefix)), None)
    value = _number(metrics[found]) if found else None  # `found` is one of the run's metric ids
    return MetricValue(metric, value, found if value is not None else None, _number(metrics.get(metric.total)) if metric.total else None)


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
