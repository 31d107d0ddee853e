"""The report.md written when a renderer failed: decision, score, the stages table and the
findings list, read from report.json's data with no template, and which renderer failed and why.

It must not fail where a template did, so it reads the plain JSON (`model_dump(mode="json")`)
with `.get` and writes every piece of text through `table_cell` (docs/contract.md, "Exit status").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from traingate.reports.render import table_cell


def render_minimal_md(data: dict[str, Any], failures: Sequence[tuple[str, str]]) -> str:
    """`data` is report.json's content; `failures` the (output, why) of each renderer that failed."""
    task, version = table_cell(data.get("task", "?")), table_cell(data.get("version", "?"))
    lines = [
        f"# traingate report (minimal) — {task} {version}",
        "",
        f"**Decision: {table_cell(data.get('decision', '?'))}** · score {table_cell(data.get('score', '?'))}/100",
        "",
        "This is a minimal report: a renderer failed, so only what report.json holds is shown here. "
        "report.json is complete; the other outputs were written.",
        "",
        *[f"- **{table_cell(output)}** failed: {table_cell(why)}" for output, why in failures],
        "",
        "## Stages",
        "",
        "| Stage | Status | Score | Findings (blocking) | Summary |",
        "|---|---|---|---|---|",
    ]
    stages = data.get("stages") or []
    for stage in stages:
        found = stage.get("findings") or []
        blocking = sum(bool(f.get("blocking")) for f in found)
        score = stage.get("score")
        summary = stage.get("skipped_reason") or stage.get("summary") or ""
        lines.append(
            f"| {table_cell(stage.get('name', '?'))} | {table_cell(stage.get('status', '?'))} | {'—' if score is None else score} "
            f"| {len(found)} ({blocking}) | {table_cell(summary)} |"
        )
    lines += ["", "## Findings", ""]
    findings = [f for stage in stages for f in stage.get("findings") or []]
    lines += [_finding_line(f) for f in findings] or ["_No findings._"]
    return "\n".join(lines) + "\n"


def _finding_line(finding: dict[str, Any]) -> str:
    loc = finding.get("location") or {}
    where = f"`{table_cell(loc.get('path', ''))}{':' + str(loc['line']) if loc.get('line') else ''}`" if loc else "—"
    marker = "**blocking**" if finding.get("blocking") else "not blocking"
    return (
        f"- [{table_cell(str(finding.get('severity', '?')).upper())}] `{table_cell(finding.get('category', '?'))}` at {where}: "
        f"{table_cell(finding.get('title', ''))} — {marker} (`{table_cell(finding.get('id', ''))}`)"
    )
