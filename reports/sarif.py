"""SARIF 2.1.0 (`report.sarif`) for code scanning: one rule per rule of the table (a category, or
one of its sub-rules), one result per finding, under its rule's id.

Locations are relative to the repository's root (code scanning resolves them against the
checkout), so a target in a subfolder names its files with the subfolder in front. A finding
without a location is anchored on the configuration file, or on the target's folder. A finding that names one cause found at several
places (the test files a suite leaves out) is one result with a location for each.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from traingate.pipeline.model.rules import Rule
from traingate.pipeline.model.schema import Finding, Location, PipelineReport, Severity
from traingate.reports.facts import RunFacts, worst_first

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA_URI = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
FINGERPRINT_KEY = "traingate/v1"
SRCROOT = "%SRCROOT%"

# SARIF has three levels for a problem; severities map onto them, worst to "error".
LEVELS = {
    Severity.CRITICAL: "error",
    Severity.HIGH: "error",
    Severity.MEDIUM: "warning",
    Severity.LOW: "note",
    Severity.INFO: "note",
}


def render_sarif(report: PipelineReport, facts: RunFacts) -> str:
    return json.dumps(sarif_log(report, facts), indent=2) + "\n"


def sarif_log(report: PipelineReport, facts: RunFacts) -> dict[str, Any]:
    rule_index = {rule.id: index for index, rule in enumerate(facts.rules)}
    results = [_result(f, facts, rule_index.get(f.rule or f.category.value)) for f in worst_first(report.findings())]
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "traingate",
                "version": report.tool_version,
                "semanticVersion": report.tool_version,
                "rules": [_rule(rule) for rule in facts.rules],
            }
        },
        # Code scanning keeps one analysis per category (the part before the last "/").
        "automationDetails": {"id": f"traingate/{report.task}/{report.version}"},
        "invocations": [
            {
                "executionSuccessful": True,
                "properties": {"decision": report.decision.value, "score": report.score, "device": report.environment.device},
            }
        ],
        "results": results,
        "columnKind": "unicodeCodePoints",
        "properties": {"task": report.task, "version": report.version, "decision": report.decision.value, "score": report.score},
    }
    if report.target.commit:
        run["properties"]["commit"] = report.target.commit
    return {"$schema": SARIF_SCHEMA_URI, "version": SARIF_VERSION, "runs": [run]}


def _rule(rule: Rule) -> dict[str, Any]:
    help_text = f"{rule.blocks_text}\n\nImpact: {rule.impact}\n\nFix: {rule.fix}\n\nMore: `traingate explain {rule.id}`"
    return {
        "id": rule.id,
        "name": "".join(part.capitalize() for part in rule.id.replace("/", "-").split("-")),
        "shortDescription": {"text": rule.description},
        "fullDescription": {"text": f"{rule.check} {rule.measure}"},
        "help": {"text": help_text, "markdown": help_text},
        "defaultConfiguration": {"level": LEVELS[rule.severity]},
        "properties": {"tags": ["traingate", rule.stage], "stage": rule.stage, "severity": rule.severity.value, "category": rule.category.value, "blocks": rule.blocks.value},
    }


def _result(finding: Finding, facts: RunFacts, rule_index: int | None) -> dict[str, Any]:
    result: dict[str, Any] = {
        "ruleId": finding.rule or finding.category.value,
        "level": LEVELS[finding.severity],
        "message": {"text": _message(finding)},
        "locations": _locations(finding, facts),
        "partialFingerprints": {FINGERPRINT_KEY: finding.id},
        "properties": {
            "severity": finding.severity.value,
            "blocking": finding.blocking,
            "stage": finding.stage,
            "evidence": finding.evidence.kind.value,
        },
    }
    if rule_index is not None:
        result["ruleIndex"] = rule_index
    return result


def _message(finding: Finding) -> str:
    verdict = "Blocks the merge." if finding.blocking else "Does not block."
    return f"{finding.title}\n\n{finding.problem}\n\nImpact: {finding.impact}\n\nFix: {finding.fix}\n\n{verdict}"


def _locations(finding: Finding, facts: RunFacts) -> list[dict[str, Any]]:
    """Every place of the finding: one cause found at several places is one result with
    several locations (`Finding.every_location`)."""
    places = finding.every_location()
    return [_location(place, facts) for place in places] if places else [_location(None, facts)]


def _location(loc: Location | None, facts: RunFacts) -> dict[str, Any]:
    physical: dict[str, Any]
    if loc is not None:
        physical = {"artifactLocation": _artifact(facts.repo_path(loc.path))}
        if loc.line:
            physical["region"] = {"startLine": loc.line}
    else:
        anchor = facts.anchor_file()
        physical = {"artifactLocation": _artifact(anchor or facts.target_folder() + "/")}
        if anchor:
            physical["region"] = {"startLine": 1}
    location: dict[str, Any] = {"physicalLocation": physical}
    if loc is not None and loc.function:
        location["logicalLocations"] = [{"name": loc.function, "kind": "function"}]
    if loc is None:
        location["message"] = {"text": "No single line: anchored on the target's configuration."}
    return location


def _artifact(path: str) -> dict[str, Any]:
    if path.startswith("/"):
        return {"uri": "file://" + quote(path)}
    return {"uri": quote(path.removeprefix("./") or "."), "uriBaseId": SRCROOT}
