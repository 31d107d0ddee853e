"""GitHub Actions workflow commands: one annotation per finding, printed to stdout.

Blocking findings are `::error`, the others `::warning` (critical to medium) or `::notice`
(low, info), worst first. GitHub shows at most ten annotations of each type per step, so at
most ten of each are printed and a last notice says how many were left out (that notice takes
one of the ten notice places when anything is left out).
"""

from __future__ import annotations

from traingate.pipeline.model.schema import Finding, PipelineReport
from traingate.reports.facts import RunFacts, is_serious, worst_first

SHOWN_PER_TYPE = 10


def escape_data(text: str) -> str:
    """The message after `::`, as the workflow-command syntax requires."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """A property value (`file=`, `title=`): data escaping plus `:` and `,`."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def annotation_type(finding: Finding) -> str:
    if finding.blocking:
        return "error"
    return "warning" if is_serious(finding.severity) else "notice"


def render_annotations(report: PipelineReport, facts: RunFacts) -> str:
    by_type: dict[str, list[Finding]] = {"error": [], "warning": [], "notice": []}
    for finding in worst_first(report.findings()):
        by_type[annotation_type(finding)].append(finding)
    over = sum(max(0, len(found) - SHOWN_PER_TYPE) for kind, found in by_type.items() if kind != "notice")
    notice_places = SHOWN_PER_TYPE - 1 if over or len(by_type["notice"]) > SHOWN_PER_TYPE else SHOWN_PER_TYPE
    limits = {"error": SHOWN_PER_TYPE, "warning": SHOWN_PER_TYPE, "notice": notice_places}
    lines: list[str] = []
    left_out: dict[str, int] = {}
    for kind, found in by_type.items():
        lines += [_command(kind, f, facts) for f in found[: limits[kind]]]
        if len(found) > limits[kind]:
            left_out[kind] = len(found) - limits[kind]
    if left_out:
        counts = ", ".join(f"{n} {kind}{'s' if n != 1 else ''}" for kind, n in left_out.items())
        total = sum(left_out.values())
        message = f"{total} more finding(s) not shown as annotations ({counts}); every finding is in report.md and report.json"
        lines.append(f"::notice title={escape_property('traingate: more findings')}::{escape_data(message)}")
    return "".join(line + "\n" for line in lines)


def _command(kind: str, finding: Finding, facts: RunFacts) -> str:
    properties: list[str] = []
    loc = finding.location
    path = facts.repo_path(loc.path) if loc is not None else facts.anchor_file()
    if path:
        properties.append(f"file={escape_property(path)}")
        line = loc.line if loc is not None else None
        if line:
            properties.append(f"line={line}")
    title = f"traingate {finding.category.value} ({finding.severity.value}{', blocking' if finding.blocking else ''}): {finding.title}"
    properties.append(f"title={escape_property(title)}")
    message = f"{finding.problem}\n\nFix: {finding.fix}\n\nFingerprint: {finding.id}"
    return f"::{kind} {','.join(properties)}::{escape_data(message)}"
