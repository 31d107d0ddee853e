"""Markdown for `traingate history`: a table of a task's versions and Mermaid charts of them."""

from __future__ import annotations

from traingate.pipeline.model.history import History, VersionRow
from traingate.reports.render import table_cell

DECISION_MARK = {"PASS": "✅ PASS", "BLOCK": "⛔ BLOCK"}


def render_history_md(history: History) -> str:
    lines = [
        f"# traingate history — {history.task}",
        "",
        f"{len(history.rows)} version(s), oldest first. New, resolved and persisting findings are counted by finding id against the version before.",
        "",
        "| Version | Date | Decision | Score | Tests passed | Findings (blocking) | New | Resolved | Persisting | Step time | Memory growth | AMP speedup | Device |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_table_row(row) for row in history.rows]
    lines += ["", *_score_chart(history), *_step_time_chart(history)]
    if history.skipped:
        lines += ["", "Left out (no usable report.json):", *(f"- {s}" for s in history.skipped)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _table_row(row: VersionRow) -> str:
    def count(value: int | None) -> str:
        return "—" if value is None else str(value)

    step = "—" if row.step_time_ms is None else f"{_fmt(row.step_time_ms)} ms ({row.step_time_id.rsplit('.', 1)[-1] if row.step_time_id else ''})"
    growth = "—" if row.memory_growth_bytes_per_step is None else f"{_fmt(row.memory_growth_bytes_per_step)} B/step"
    speedup = "—" if row.amp_speedup is None else f"{_fmt(row.amp_speedup)}x"
    cells = [
        f"{row.version}" + (f" (`{row.folder}/`)" if row.folder != row.version else ""),
        row.started_at,
        DECISION_MARK.get(row.decision, row.decision),
        str(row.score),
        "—" if row.tests_collected is None else f"{row.tests_passed if row.tests_passed is not None else '—'} of {row.tests_collected}",
        f"{row.findings} ({row.blocking})",
        count(row.new),
        count(row.resolved),
        count(row.persisting),
        step,
        growth,
        speedup,
        row.device,
    ]
    return "| " + " | ".join(table_cell(c) for c in cells) + " |"


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


def _step_time_chart(history: History) -> list[str]:
    # Only versions whose step time was measured: a missing value is not a zero.
    timed = [r for r in history.rows if r.step_time_ms is not None]
    if not timed:
        return ["_No version has a measured step time (the performance stage did not run or measured none)._"]
    top = max(r.step_time_ms or 0.0 for r in timed)
    return [
        "## Step time by version",
        "",
        "```mermaid",
        "xychart-beta",
        f'    title "{history.task}: median step time (ms) by version"',
        f"    x-axis {_labels(timed)}",
        f'    y-axis "step time (ms)" 0 --> {_fmt(top * 1.2) if top > 0 else 1}',
        f"    line [{', '.join(_fmt(r.step_time_ms or 0.0) for r in timed)}]",
        "```",
    ]
