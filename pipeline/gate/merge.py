"""`traingate merge`: one report and one decision from stage reports made on different machines.

A CI splits a run across runners (the execution stage on a CPU runner, performance and
concurrency with `--device cuda` on a GPU runner) and merges their `report.json` files. The
stage reports are taken as they are, each with the environment it ran in; the decision and
the score are recomputed from them by the policy, never copied from the inputs. Reports of
different tasks, versions or commits, a stage given twice, a schema this version does not
know, or policies that differ are refused; a requested stage that no input holds is a
blocking `stage-error`.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from traingate.pipeline.model.config import PolicyConfig
from traingate.pipeline.model.findings import stage_error
from traingate.pipeline.gate.policy import decide, stage_score, stage_status
from traingate.pipeline.gate.orchestrator import stages_not_run
from traingate.pipeline.model.schema import (
    SCHEMA_VERSION,
    Acceptance,
    BaselineComparison,
    Environment,
    Finding,
    PipelineReport,
    Severity,
    StageReport,
    VerificationReview,
    WaiverEntry,
)

from traingate import __version__

# Report schemas this version reads: every one it has written (later ones only add fields).
KNOWN_SCHEMA_VERSIONS = frozenset({"1.0", "1.1", SCHEMA_VERSION})
# A stage given only by a configuration error report.
CONFIGURATION_STAGE = "configuration"


class MergeError(Exception):
    """The reports cannot be merged; one line naming the files."""


def load_report(path: Path) -> PipelineReport:
    """One report.json, checked for a schema version this version knows."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise MergeError(f"cannot read {path}: {reason}") from None
    if not isinstance(data, dict) or "schema_version" not in data:
        raise MergeError(f"{path} is not a traingate report.json (no schema_version)")
    if data["schema_version"] not in KNOWN_SCHEMA_VERSIONS:
        known = ", ".join(sorted(KNOWN_SCHEMA_VERSIONS))
        raise MergeError(f"{path}: unknown schema version {data['schema_version']!r} (this traingate {__version__} reads {known})")
    try:
        return PipelineReport.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise MergeError(f"{path} is not a traingate report.json: {where}: {err['msg']}") from None


def merge_reports(inputs: list[tuple[str, PipelineReport]], requested: list[str], known: list[str]) -> PipelineReport:
    """The merged report. `inputs` pairs each report with the name it is refused by;
    `requested` stages must all be present; `known` orders the stages."""
    if not inputs:
        raise MergeError("no report to merge")
    _check_same_run(inputs)
    stages = _stages_once(inputs)
    block_on = _block_on(inputs[0][1])
    for name in requested:
        if name not in stages:
            stages[name] = _missing_stage(name, block_on, [label for label, _ in inputs])
    order = [CONFIGURATION_STAGE, *known]
    merged = sorted(stages.values(), key=lambda s: order.index(s.name) if s.name in order else len(order))
    decision, score = decide(merged)
    first = inputs[0][1]
    reports = [r for _, r in inputs]
    started_at, duration_s = _span(reports)
    return PipelineReport(
        tool_version=__version__,
        task=first.task,
        version=first.version,
        target=first.target,
        environment=_combined_environment([s.environment for s in merged if s.environment is not None] or [first.environment]),
        started_at=started_at,
        duration_s=duration_s,
        decision=decision,
        score=score,
        stages=merged,
        baseline=_combined_baseline(reports),
        policy=first.policy,
        stages_not_run=stages_not_run(known, merged, left_out="not requested with merge --stages"),
        acceptance=(acceptance := _combined_acceptance(reports)),
        verification=_combined_verification(reports, acceptance),
        # The run whose execution stage chose it (a split run's other parts observed nothing).
        observed_training=next((r.observed_training for r in reports if r.observed_training is not None), None),
    )


def _check_same_run(inputs: list[tuple[str, PipelineReport]]) -> None:
    first_label, first = inputs[0]
    for label, report in inputs[1:]:
        for what, mine, theirs in (
            ("task", first.task, report.task),
            ("version", first.version, report.version),
            ("commit", first.target.commit, report.target.commit),
        ):
            if mine != theirs:
                raise MergeError(f"{label} is of {what} {theirs!r}, {first_label} of {what} {mine!r}: only stage reports of one run can be merged")
        if _policy_values(first) != _policy_values(report):
            raise MergeError(f"{label} and {first_label} were made under different policies: run every part with the same --policy")


def _policy_values(report: PipelineReport) -> dict[str, Any]:
    return {s.key: s.value for s in report.policy.settings} if report.policy else {}


def _stages_once(inputs: list[tuple[str, PipelineReport]]) -> dict[str, StageReport]:
    stages: dict[str, StageReport] = {}
    where: dict[str, str] = {}
    for label, report in inputs:
        for stage in report.stages:
            if stage.name == CONFIGURATION_STAGE and stage.name in stages:
                # Every part compared the same configurations: its findings once each.
                stages[stage.name] = _same_configuration(stages[stage.name], stage)
                continue
            if stage.name in stages:
                raise MergeError(f"stage {stage.name!r} is in both {where[stage.name]} and {label}: give each stage once")
            where[stage.name] = label
            # Each stage keeps the machine it ran on.
            stages[stage.name] = stage if stage.environment is not None else stage.model_copy(update={"environment": report.environment})
    return stages


def _same_configuration(first: StageReport, other: StageReport) -> StageReport:
    """The gate's configuration findings of two parts of one run, each once (a new waiver's may be in one part only)."""
    findings = list({f.id: f for f in [*first.findings, *other.findings]}.values())
    status = stage_status(findings, None)
    return first.model_copy(update={"findings": sorted(findings, key=Finding.sort_key), "status": status, "score": stage_score(status, findings)})


def _combined_verification(reports: list[PipelineReport], acceptance: Acceptance | None) -> VerificationReview | None:
    """The first part's comparison (every part read the same two configurations), with the new waivers of all parts."""
    first = next((r.verification for r in reports if r.verification is not None), None)
    if first is None or acceptance is None:
        return first
    return first.model_copy(update={"new_waivers": [w for w in acceptance.waivers if w.added]})


def _block_on(report: PipelineReport) -> set[Severity]:
    """The severities that blocked in the run that wrote `report`: its recorded `block_on`,
    read back through the policy's own model (the default where none was recorded)."""
    recorded = [s for s in report.policy.settings if s.key == "block_on"] if report.policy else []
    return set(PolicyConfig.model_validate({s.key: s.value for s in recorded}).block_on)


def _missing_stage(name: str, block_on: set[Severity], labels: list[str]) -> StageReport:
    what = "no merged report holds this stage"
    error = stage_error(
        name,
        what,
        reason="missing-from-merge",
        block_on=block_on,
        problem=f"The {name} stage was requested, but none of the merged reports ({', '.join(labels)}) holds it; nothing it checks was checked.",
        fix=f"Merge the report of the job that runs `traingate run --stages {name}`, or leave {name} out of `merge --stages`.",
    )
    status = stage_status([error], None)
    return StageReport(name=name, status=status, score=stage_score(status, [error]), duration_s=0.0, summary=what, findings=[error])


def _combined_environment(envs: list[Environment]) -> Environment:
    def joined(values: list[str]) -> str:
        return " + ".join(dict.fromkeys(v for v in values if v))

    return Environment(
        python=joined([e.python for e in envs]),
        torch=joined([e.torch or "" for e in envs]) or None,
        device=joined([e.device for e in envs]),
        device_name=joined([e.device_name for e in envs]),
        platform=joined([e.platform for e in envs]),
    )


def _span(reports: list[PipelineReport]) -> tuple[str, float]:
    """From the first start to the last end, over the parts."""
    try:
        starts = [datetime.fromisoformat(r.started_at) for r in reports]
        ends = [s.timestamp() + r.duration_s for s, r in zip(starts, reports, strict=True)]
        first = min(starts)
        return first.isoformat(timespec="seconds"), round(max(ends) - first.timestamp(), 3)
    except (ValueError, TypeError):
        return min(r.started_at for r in reports), round(sum(r.duration_s for r in reports), 3)


def _combined_baseline(reports: list[PipelineReport]) -> BaselineComparison | None:
    """Exact when every part was compared with the same baseline: a baseline finding is
    resolved only when no part still has it, i.e. when every part lists it as fixed."""
    comparisons = [r.baseline for r in reports]
    if any(c is None for c in comparisons):
        return None
    parts = [c for c in comparisons if c is not None]
    versions = {c.version for c in parts}
    if len(versions) > 1:
        raise MergeError(f"the reports were compared with different baselines (versions {', '.join(sorted(str(v) for v in versions))})")
    fixed = set(parts[0].fixed_findings)
    for c in parts[1:]:
        fixed &= set(c.fixed_findings)
    return BaselineComparison(
        path=parts[0].path,
        version=parts[0].version,
        new_findings=sorted({i for c in parts for i in c.new_findings}),
        fixed_findings=sorted(fixed),
        persisting_findings=sorted({i for c in parts for i in c.persisting_findings}),
        metric_deltas=[d for c in parts for d in c.metric_deltas],
    )


# When a waiver's outcome differs between parts, the first of these wins.
_WAIVER_PRECEDENCE = ("needs-approval", "applied", "expired", "disallowed", "refused", "unused")


def _combined_acceptance(reports: list[PipelineReport]) -> Acceptance | None:
    parts = [r.acceptance for r in reports if r.acceptance is not None]
    if not parts:
        return None
    by_origin: dict[str, list[WaiverEntry]] = {}
    for part in parts:
        for entry in part.waivers:
            by_origin.setdefault(entry.origin, []).append(entry)
    waivers = []
    for entries in by_origin.values():
        best = min(entries, key=lambda e: _WAIVER_PRECEDENCE.index(e.status) if e.status in _WAIVER_PRECEDENCE else len(_WAIVER_PRECEDENCE))
        matched = sorted({i for e in entries for i in e.matched})
        waivers.append(best.model_copy(update={"matched": matched}))
    return Acceptance(
        block="new" if any(p.block == "new" for p in parts) else "all",
        block_note=next((p.block_note for p in parts if p.block_note), ""),
        waivers_allowed=all(p.waivers_allowed for p in parts),
        waivers=waivers,
    )
