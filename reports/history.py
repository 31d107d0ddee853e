"""Markdown for `traingate history`: a table of a task's versions and Mermaid charts of them.

The columns after the findings, and the charts after the score's, are the registered stages'
history metrics (`traingate.pipeline.model.history.HistoryMetric`), in the stages' order."""

from __future__ import annotations

from traingate.pipeline.model.history import History, HistoryMetric, MetricValue, VersionRow
from traingate.reports.render import table_cell

DECISION_MARK = {"PASS": "✅ PASS", "BLOCK": "⛔ BLOCK"}


def render_history_md(history: History) -> str:
    shown = [value.metric for value in history.rows[0].metrics] if history.rows else []
    header = ["Version", "Date", "Decision", "Score", "Findings (blocking)", "New", "Resolved", "Persisting", *(m.column for m in shown), "Device"]
    lines = [
        f"# traingate history — {history.task}",
        "",
        f"{len(history.rows)} version(s), oldest first. New, resolved and persisting findings are counted by finding id against the version before.",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
    ]
    lines += [_table_row(row) for row in history.rows]
    lines += ["", *_score_chart(history)]
    for index, metric in enumerate(shown):
        if metric.chart:
            lines += _metric_chart(history, index, metric)
    if history.skipped:
        lines += ["", "Left out (no usable report.json):", *(f"- {s}" for s in history.skipped)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _table_row(row: VersionRow) -> str:
    def count(value: int | None) -> str:
        return "—" if value is None else str(value)

    cells = [
        f"{row.version}" + (f" (`{row.folder}/`)" if row.folder != row.version else ""),
        row.started_at,
        DECISION_MARK.get(row.decision, row.decision),
        str(row.score),
        f"{row.findings} ({row.blocking})",
        count(row.new),
        count(row.resolved),
        count(row.persisting),
        *(_cell(value) for value in row.metrics),
        row.device,
    ]
    return "| " + " | ".join(table_cell(c) for c in cells) + " |"


def _cell(value: MetricValue) -> str:
    metric = value.metric
    if metric.total:
        if value.total is None:
            return "—"
        # A count of a total (tests passed of those collected): whole numbers.
        return f"{int(value.value) if value.value is not None else '—'} of {int(value.total)}"
    if value.value is None:
        return "—"
    variant = f" ({value.id.rsplit('.', 1)[-1]})" if metric.variant and value.id else ""
    return f"{_fmt(value.value)}{metric.unit}{variant}"


def _fmt(value: float) -> str:
    return f"{value:.4g}"


def _labels(rows: list[VersionRow]) -> str:
    return "[" + ", ".join('"' + r.version.replace('"', "'") + '"' for r in rows) + "]"


def _score_chart(history: History) -> list[str]:
    return [
        "## Score by version",
        "",
        "```mermaid",
        "xychart-beta",
        f'    title "{history.task}: score by version"',
        f"    x-axis {_labels(history.rows)}",
        '    y-axis "score" 0 --> 100',
        f"    bar [{', '.join(str(r.score) for r in history.rows)}]",
        f"    line [{', '.join(str(r.score) for r in history.rows)}]",
        "```",
        "",
    ]


def _metric_chart(history: History, index: int, metric: HistoryMetric) -> list[str]:
    # Only versions where it was measured: a missing value is not a zero.
    measured = [(row, value) for row in history.rows if (value := row.metrics[index].value) is not None]
    if not measured:
        return [f"_No version has a measured {metric.column.lower()} (the {metric.stage} stage did not run or measured none)._"]
    top = max(value for _, value in measured)
    return [
        f"## {metric.column} by version",
        "",
        "```mermaid",
        "xychart-beta",
        f'    title "{history.task}: {metric.chart_title or metric.chart} by version"',
        f"    x-axis {_labels([row for row, _ in measured])}",
        f'    y-axis "{metric.chart}" 0 --> {_fmt(top * 1.2) if top > 0 else 1}',
        f"    line [{', '.join(_fmt(value) for _, value in measured)}]",
        "```",
    ]
