"""Keeping report.md small enough for a pull-request comment by shortening evidence, never findings.

Every finding keeps its title, place, problem, impact, fix and fingerprint; only its evidence
data and traceback are cut, each with a note naming the stage report that holds them whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from traingate.pipeline.model.schema import Evidence, Finding, PipelineReport

# GitHub refuses comments over 65,536 characters; the margin leaves room for a bot's header.
REPORT_MD_LIMIT = 65_000
SUMMARY_LIMIT = 300


def where_whole(finding: Finding) -> str:
    return f"{finding.stage}.md and report.json"


def fit(render: Callable[[PipelineReport], str], report: PipelineReport, limit: int = REPORT_MD_LIMIT) -> str:
    """`render(report)`, with evidence cut as little as needed to stay within `limit` characters."""
    text = render(report)
    if len(text) <= limit:
        return text
    bare = render(clip_evidence(report, 0))
    if len(bare) > limit:
        return _cut(bare, limit)
    pieces = sum(bool(f.evidence.data) + bool(f.evidence.traceback) for f in report.findings())
    budget = (limit - len(bare)) // max(1, pieces)
    while budget > 0:
        text = render(clip_evidence(report, budget))
        if len(text) <= limit:
            return text
        budget //= 2
    return bare


def clip_evidence(report: PipelineReport, budget: int) -> PipelineReport:
    """A copy of the report whose evidence data and tracebacks each take about `budget` characters at most."""
    stages = [
        stage.model_copy(update={"findings": [_clip_finding(f, budget) for f in stage.findings]})
        for stage in report.stages
    ]
    return report.model_copy(update={"stages": stages})


def _clip_finding(finding: Finding, budget: int) -> Finding:
    evidence = finding.evidence
    data_size = len(json.dumps(evidence.data, indent=2, default=str)) if evidence.data else 0
    traceback = evidence.traceback
    summary = evidence.summary
    if data_size <= budget and (traceback is None or len(traceback) <= budget) and len(summary) <= max(budget, SUMMARY_LIMIT):
        return finding
    data = evidence.data
    if data_size > budget:
        data = {"clipped": f"{data_size:,} characters of evidence data, shortened here; the whole data is in {where_whole(finding)}"}
        if budget > 0:
            data.update(shrink(evidence.data, budget))
    if traceback is not None and len(traceback) > budget:
        # The end of a traceback says where it failed; keep that part.
        kept = traceback[len(traceback) - budget :] if budget > 0 else ""
        traceback = f"… {len(traceback) - len(kept):,} characters cut; the whole text is in {where_whole(finding)} …\n{kept}"
    if len(summary) > max(budget, SUMMARY_LIMIT):
        summary = summary[: max(budget, SUMMARY_LIMIT)] + f"… (cut; whole in {where_whole(finding)})"
    clipped = Evidence(kind=evidence.kind, summary=summary, traceback=traceback, data=data)
    return finding.model_copy(update={"evidence": clipped})


def shrink(value: Any, budget: int) -> Any:
    """A smaller copy of JSON-like `value`: long strings cut, lists and objects shortened, with counts of what was left out."""
    if isinstance(value, str):
        return value if len(value) <= budget else value[:budget] + f"… ({len(value):,} characters)"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        used = 0
        for index, (key, item) in enumerate(value.items()):
            small = shrink(item, max(0, budget - used))
            used += len(json.dumps({key: small}, default=str))
            if used > budget and out:
                out["…"] = f"{len(value) - index} more key(s)"
                break
            out[str(key)] = small
        return out
    if isinstance(value, list | tuple):
        items: list[Any] = []
        used = 0
        for index, item in enumerate(value):
            small = shrink(item, max(0, budget - used))
            used += len(json.dumps(small, default=str)) + 2
            if used > budget and items:
                items.append(f"… {len(value) - index} more item(s)")
                break
            items.append(small)
        return items
    return value


def _cut(text: str, limit: int) -> str:
    """The last resort when even the findings alone are too long: cut at a line, say where the rest is."""
    note = "\n\n---\n_This report is cut here to fit a comment; every finding is in the stage reports and report.json._\n"
    head = text[: limit - len(note)]
    return head[: head.rfind("\n") + 1 or len(head)] + note
