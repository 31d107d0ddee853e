"""Stage reports as the parts of a split run would write them, built through the real finding
builders and the policy (status and score come from `traingate.pipeline.gate.policy`)."""

from __future__ import annotations

from pathlib import Path

from traingate.pipeline.model.findings import finding
from traingate.pipeline.gate.policy import decide, stage_score, stage_status
from traingate.pipeline.model.schema import (
    Category,
    Environment,
    Evidence,
    EvidenceKind,
    Finding,
    Location,
    Metric,
    PipelineReport,
    PolicyProvenance,
    PolicySetting,
    Severity,
    StageReport,
    TargetInfo,
)

BLOCK_ON = {Severity.CRITICAL, Severity.HIGH}


def measured(stage: str, category: Category, severity: Severity, path: str, key: str) -> Finding:
    return finding(
        stage=stage, category=category, severity=severity, title=f"{category.value} at {path}", location=Location(path=path, line=3, function="train"),
        problem="planted", evidence=Evidence(kind=EvidenceKind.MEASURED, summary="measured"), block_on=BLOCK_ON, key=key,
    )


def stage(name: str, findings: list[Finding] | None = None, metrics: list[Metric] | None = None, skipped: str | None = None) -> StageReport:
    found = findings or []
    status = stage_status(found, skipped)
    return StageReport(
        name=name, status=status, score=stage_score(status, found), duration_s=1.5, summary=f"{name} ran", skipped_reason=skipped,
        metrics=metrics or [], findings=found,
    )


def report(
    stages: list[StageReport], *, device: str = "cpu", task: str = "T1", version: str = "v1", commit: str | None = "abc123",
    started_at: str = "2026-11-20T10:00:00+00:00", block_on: list[str] | None = None,
) -> PipelineReport:
    decision, score = decide(stages)
    policy = PolicyProvenance(settings=[PolicySetting(key="block_on", value=block_on or ["critical", "high"], source="default")])
    return PipelineReport(
        tool_version="test", task=task, version=version, target=TargetInfo(path="/nonexistent/target", commit=commit),
        environment=Environment(python="3.11", torch="2.13.0", device=device, device_name="GPU 0" if device == "cuda" else "CPU"),
        started_at=started_at, duration_s=3.0, decision=decision, score=score, stages=stages, policy=policy,
    )


def write(report_: PipelineReport, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(report_.model_dump_json(indent=2))
    return path
