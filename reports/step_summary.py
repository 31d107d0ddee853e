"""A compact markdown summary for `$GITHUB_STEP_SUMMARY`: decision, score, stages, blocking findings.

It carries no links (the job page shows it next to the artifacts, where links would point
nowhere) and lists at most `MAX_BLOCKING` blocking findings; the rest are in report.md.
"""

from __future__ import annotations

import json

from traingate.pipeline.model.schema import PipelineReport
from traingate.reports.facts import RunFacts, location_text
from traingate.reports.render import table_cell

MAX_BLOCKING = 20
DECISION_MARK = {"PASS": "✅", "BLOCK": "⛔"}


def render_step_summary(report: PipelineReport, facts: RunFacts) -> str:
    findings = report.findings()
    blocking = [f for f in findings if f.blocking]
    lines = [
        f"### {DECISION_MARK.get(report.decision.value, '')} traingate {report.decision.value} — {table_cell(report.task)} {table_cell(report.version)}",
        "",
        f"**Score** {report.score}/100 · **{len(blocking)}** blocking of {len(findings)} finding(s) · "
        f"{report.environment.device} ({table_cell(report.environment.device_name)}) · {report.duration_s:.1f} s",
        "",
    ]
    lines += verification_lines(report)
    past = report.observed_training.past_limit_note() if report.observed_training else None
    lines += [f"**{table_cell(past[0].upper() + past[1:])}**", ""] if past else []
    lines += [
        "| Stage | Status | Score | Findings | Blocking | Duration |",
        "|---|---|---|---|---|---|",
    ]
    for stage in report.stages:
        score = stage.score if stage.score is not None else "—"
        status = stage.status.value + (f" ({table_cell(stage.skipped_reason)})" if stage.skipped_reason else "")
        stage_blocking = sum(f.blocking for f in stage.findings)
        lines.append(f"| {stage.name} | {status} | {score} | {len(stage.findings)} | {stage_blocking} | {stage.duration_s:.1f} s |")
    if blocking:
        lines += ["", "**Blocking findings**", "", "| Severity | Category | Location | Finding |", "|---|---|---|---|"]
        for finding in blocking[:MAX_BLOCKING]:
            lines.append(
                f"| {finding.severity.value} | `{finding.category.value}` | `{table_cell(location_text(finding, facts))}` | {table_cell(finding.title)} |"
            )
        if len(blocking) > MAX_BLOCKING:
            lines += ["", f"…and {len(blocking) - MAX_BLOCKING} more blocking finding(s) in report.md."]
    lines += ["", "Every finding, with its evidence and fix, is in report.md (kept with the job's artifacts).", ""]
    return "\n".join(lines) + "\n"


def verification_lines(report: PipelineReport) -> list[str]:
    """What the change changed in how it is verified (its configuration, its new waivers), first."""
    review = report.verification
    if review is None or not (review.changes or review.new_waivers):
        return []
    lines = ["**What this change changed in how it is verified**", "", "| Key | Baseline | This change | What the gate did |", "|---|---|---|---|"]
    for change in review.changes:
        lines.append(f"| `{table_cell(change.key)}` | `{table_cell(json.dumps(change.baseline))}` | `{table_cell(json.dumps(change.current))}` | {table_cell(change.action)} |")
    for waiver in review.new_waivers:
        lines.append(f"| new waiver `{table_cell(waiver.origin)}` | — | {table_cell(', '.join(waiver.categories) or waiver.id or '')} | {waiver.status} |")
    return [*lines, ""]
