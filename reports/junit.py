"""JUnit XML (`report.junit.xml`) for the test tabs of GitLab, Jenkins and Azure Pipelines.

One `<testsuite>` per stage; one `<testcase>` per check, that is per category the stage owns
in the rule table, plus one per category a stage-independent check (`hang`, `stage-error`,
`leftover-process`, ...) reported in that stage. A check with blocking findings fails
(`<failure>`; `<error>` for `stage-error`, a check that could not run); its non-blocking
findings go to `<system-out>`; every check of a skipped stage is `<skipped>` with the reason.
A case per check rather than per finding keeps the number of test cases stable from one
version to the next, so a CI's test history follows each check.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from traingate.pipeline.model.schema import Category, Finding, PipelineReport, StageReport, StageStatus
from traingate.reports.facts import RunFacts, location_text

# Characters XML 1.0 cannot hold at all; evidence from a crashed process may contain them.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


def render_junit(report: PipelineReport, facts: RunFacts) -> str:
    root = ET.Element("testsuites", name=f"traingate {xml_text(report.task)} {xml_text(report.version)}")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for stage in report.stages:
        suite = _suite(report, stage, facts)
        root.append(suite)
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{report.duration_s:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def checks_of(stage: StageReport, facts: RunFacts) -> list[str]:
    """The categories a stage checked: the ones it owns, then any other it reported."""
    checks = facts.categories_of(stage.name)
    for finding in sorted(stage.findings, key=Finding.sort_key):
        if finding.category.value not in checks:
            checks.append(finding.category.value)
    return checks or [stage.name]


def _suite(report: PipelineReport, stage: StageReport, facts: RunFacts) -> ET.Element:
    suite = ET.Element("testsuite", name=stage.name, timestamp=report.started_at, time=f"{stage.duration_s:.3f}")
    properties = ET.SubElement(suite, "properties")
    for name, value in (("status", stage.status.value), ("score", "" if stage.score is None else str(stage.score)), ("summary", stage.summary)):
        ET.SubElement(properties, "property", name=name, value=xml_text(value))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for check in checks_of(stage, facts):
        found = sorted((f for f in stage.findings if f.category.value == check), key=Finding.sort_key)
        case = ET.SubElement(suite, "testcase", classname=f"traingate.{stage.name}", name=check)
        counts["tests"] += 1
        blocking = [f for f in found if f.blocking]
        if blocking:
            kind = "error" if check == Category.STAGE_ERROR.value else "failure"
            counts["errors" if kind == "error" else "failures"] += 1
            more = f" (and {len(blocking) - 1} more)" if len(blocking) > 1 else ""
            result = ET.SubElement(case, kind, message=xml_text(blocking[0].title + more), type=check)
            result.text = xml_text("\n\n".join(_finding_text(f, facts) for f in blocking))
        elif stage.status is StageStatus.SKIPPED:
            counts["skipped"] += 1
            ET.SubElement(case, "skipped", message=xml_text(stage.skipped_reason or "stage skipped"))
        others = [f for f in found if not f.blocking]
        if others:
            ET.SubElement(case, "system-out").text = xml_text("\n\n".join(_finding_text(f, facts) for f in others))
    for key, count in counts.items():
        suite.set(key, str(count))
    return suite


def _finding_text(finding: Finding, facts: RunFacts) -> str:
    verdict = "blocking" if finding.blocking else "not blocking"
    return (
        f"[{finding.severity.value}, {verdict}] {finding.title}\n"
        f"  at {location_text(finding, facts)}\n"
        f"  {finding.problem}\n"
        f"  Fix: {finding.fix}\n"
        f"  Fingerprint: {finding.id}"
    )
