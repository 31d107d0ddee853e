"""Runs each stage as its own agent process and assembles the report from what they return.

The target's code never runs in this process. Each stage agent gets a wall budget; past it
the agent's whole process group is killed and the stage reports `hang` with every thread's
stack. Whatever a stage hands back is validated here; anything malformed is a stage error.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from pydantic import ValidationError

from traingate import __version__
from traingate.pipeline.config import TargetConfig
from traingate.pipeline.isolation import ChildResult, python_argv, run_child
from traingate.pipeline.policy import decide, stage_score, stage_status
from traingate.pipeline.schema import (
    BaselineComparison,
    Category,
    Environment,
    Evidence,
    EvidenceKind,
    Finding,
    PipelineReport,
    Severity,
    StageOutcome,
    StageReport,
    TargetInfo,
)
from traingate.pipeline.registry import Stage
from traingate.stages.base import StageContext, hang_finding

ANY_STAGE_CATEGORIES = frozenset({Category.HANG, Category.STAGE_ERROR, Category.CONFIG_ERROR})
NEVER_BLOCKING = frozenset({Category.DEPRECATED_API})


class Observer(Protocol):
    """Reporters observe the run; they never drive it."""

    def stage_started(self, name: str, index: int, total: int) -> None: ...

    def stage_finished(self, report: StageReport) -> None: ...


@dataclass
class RunRequest:
    root: Path
    task: str
    version: str
    stages: list[str]
    out: Path
    device: str  # resolved: "cpu" or "cuda"
    baseline: dict[str, Any] | None = None
    baseline_path: str | None = None
    observers: list[Observer] = field(default_factory=list)
    # `module:function` building the stage registry inside each agent process.
    registry_factory: str = "traingate.pipeline.registry:build_registry"


def run_pipeline(request: RunRequest, config: TargetConfig, registry: dict[str, Stage]) -> PipelineReport:
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.monotonic()
    reports: list[StageReport] = []
    for index, name in enumerate(request.stages, start=1):
        for obs in request.observers:
            obs.stage_started(name, index, len(request.stages))
        skip = _skip_reason(name, reports)
        if skip is not None:
            report = StageReport(name=name, status=stage_status([], skip), score=None, duration_s=0.0, summary="not run", skipped_reason=skip)
        else:
            report = run_stage(name, registry[name], request, config)
        reports.append(report)
        for obs in request.observers:
            obs.stage_finished(report)
    return assemble(request, reports, started_at, time.monotonic() - started, compare_baseline(request, reports))


def assemble(
    request: RunRequest, stages: list[StageReport], started_at: str, duration_s: float, baseline: BaselineComparison | None
) -> PipelineReport:
    """The whole report; decision and score come from the stage reports alone."""
    decision, score = decide(stages)
    return PipelineReport(
        tool_version=__version__,
        task=request.task,
        version=request.version,
        target=TargetInfo(path=str(request.root), commit=git_commit(request.root)),
        environment=environment(request.device),
        started_at=started_at,
        duration_s=round(duration_s, 3),
        decision=decision,
        score=score,
        stages=stages,
        baseline=baseline,
    )


def _skip_reason(name: str, done: list[StageReport]) -> str | None:
    """Profiling a training function that crashes or hangs in its smoke call measures nothing,
    and running it again would only spend the budget a second time."""
    if name == "execution":
        return None
    purpose = "profile" if name == "performance" else "observe"
    for report in done:
        for f in report.findings:
            where = f" at {f.location.path}:{f.location.line}" if f.location else ""
            if f.category is Category.ENTRYPOINT_CRASH and f.blocking:
                return f"the entrypoint crashed in the execution stage{where}; nothing to {purpose}"
            if f.category is Category.HANG and f.stage == "execution" and "smoke call" in f.title:
                return f"the entrypoint's smoke call did not finish in the execution stage{where}; nothing to {purpose}"
    return None


def run_stage(name: str, stage: Stage, request: RunRequest, config: TargetConfig) -> StageReport:
    budget = float(config.timeout_s)
    margin = min(5.0, budget * 0.1)
    scratch = (request.out / "work" / name).resolve()
    scratch.mkdir(parents=True, exist_ok=True)
    out = scratch / "outcome.json"
    out.unlink(missing_ok=True)
    agent_request = {
        "stage": name,
        "root": str(request.root),
        "config": config.model_dump(mode="json"),
        "device": request.device,
        "deadline": time.time() + budget,
        "scratch": str(scratch),
        "margin_s": margin,
        "baseline": request.baseline,
        "registry": request.registry_factory,
        "out": str(out),
    }
    req_path = scratch / "agent-request.json"
    req_path.write_text(json.dumps(agent_request))
    child = run_child(python_argv("traingate.stages.agent", str(req_path)), cwd=request.root, budget_s=budget, scratch=scratch, name="agent")
    ctx = StageContext(stage=name, root=request.root, config=config, device=request.device, deadline=time.time(), scratch=scratch)
    outcome = _read_outcome(ctx, stage, child, out)
    findings = sorted(outcome.findings, key=Finding.sort_key)
    status = stage_status(findings, outcome.skipped_reason)
    return StageReport(
        name=name,
        status=status,
        score=stage_score(status, findings),
        duration_s=round(child.duration_s, 3),
        summary=outcome.summary,
        skipped_reason=outcome.skipped_reason,
        metrics=outcome.metrics,
        findings=findings,
        details=outcome.details,
    )


def _read_outcome(ctx: StageContext, stage: Stage, child: ChildResult, out: Path) -> StageOutcome:
    if child.timed_out:
        return StageOutcome(summary=f"overran its {ctx.config.timeout_s:.0f}s budget", findings=[hang_finding(ctx, child, f"The {ctx.stage} stage")])
    if not out.is_file():
        return _error(ctx, "the stage agent ended without handing back a result", child)
    try:
        payload = json.loads(out.read_text())
        if "error" in payload:
            return _error(ctx, "the stage raised an exception", child, payload["error"])
        outcome = StageOutcome.model_validate(payload["outcome"])
    except (json.JSONDecodeError, KeyError, TypeError, ValidationError) as exc:
        return _error(ctx, "the stage handed back a malformed result", child, str(exc))
    problem = _inconsistency(ctx, stage, outcome)
    if problem:
        return _error(ctx, f"the stage handed back an inconsistent result: {problem}", child)
    return outcome


def _inconsistency(ctx: StageContext, stage: Stage, outcome: StageOutcome) -> str | None:
    allowed = stage.categories | ANY_STAGE_CATEGORIES
    block_on = set(ctx.config.policy.block_on)
    for f in outcome.findings:
        if f.stage != ctx.stage:
            return f"finding {f.id} claims stage {f.stage!r}"
        if f.category not in allowed:
            return f"category {f.category.value} does not belong to this stage"
        if f.blocking and (f.severity not in block_on or f.evidence.kind is EvidenceKind.STATIC or f.category in NEVER_BLOCKING):
            return f"finding {f.id} blocks against the policy"
    return None


def _error(ctx: StageContext, what: str, child: ChildResult, detail: str = "") -> StageOutcome:
    tail = detail or (child.stderr[-8000:] if child.stderr else "")
    exit_desc = child.signal_name or f"exit status {child.returncode}"
    return StageOutcome(
        summary=what,
        findings=[
            ctx.finding(
                category=Category.STAGE_ERROR,
                severity=Severity.CRITICAL,
                title=f"The {ctx.stage} stage failed: {what}",
                location=None,
                problem=f"{what} ({exit_desc}); nothing it would have checked can be trusted.",
                impact="The gate cannot vouch for this version, so it blocks (fail closed).",
                fix="Read the traceback below; if it is a defect of traingate, report it with this report.json.",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=exit_desc, traceback=tail or None, data={"returncode": child.returncode}),
                key=what,
            )
        ],
    )


def environment(device: str) -> Environment:
    torch_version: str | None
    device_name = platform.processor() or platform.machine()
    try:
        import torch

        torch_version = str(torch.__version__)
        if device == "cuda":
            device_name = torch.cuda.get_device_name(0)
        else:
            device_name = _cpu_name() or device_name
    except ImportError:
        torch_version = None
    return Environment(
        python=platform.python_version(),
        torch=torch_version,
        device=device,
        device_name=device_name,
        platform=f"{sys.platform} {platform.machine()}",
    )


def _cpu_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def git_commit(root: Path) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def compare_baseline(request: RunRequest, reports: list[StageReport]) -> BaselineComparison | None:
    base = request.baseline
    if base is None:
        return None
    old_ids = {f["id"] for s in base.get("stages", []) for f in s.get("findings", [])}
    new_ids = {f.id for s in reports for f in s.findings}
    old_metrics = {(s["name"], m["name"]): m for s in base.get("stages", []) for m in s.get("metrics", [])}
    deltas = []
    for s in reports:
        for m in s.metrics:
            old = old_metrics.get((s.name, m.name))
            if old and isinstance(old.get("value"), (int, float)) and isinstance(m.value, (int, float)):
                deltas.append({"stage": s.name, "metric": m.name, "unit": m.unit, "baseline": old["value"], "current": m.value})
    return BaselineComparison(
        path=request.baseline_path or "",
        version=base.get("version"),
        new_findings=sorted(new_ids - old_ids),
        fixed_findings=sorted(old_ids - new_ids),
        metric_deltas=deltas,
    )


def config_error_report(request: RunRequest, file: str, key: str, message: str) -> PipelineReport:
    """The report written when the configuration is invalid: one blocking config-error."""
    finding = Finding.create(
        stage="configuration",
        category=Category.CONFIG_ERROR,
        severity=Severity.CRITICAL,
        title=f"Invalid configuration: {key or file}",
        location=None,
        problem=f"{file}: {key + ': ' if key else ''}{message}",
        impact="traingate cannot run this target as configured, so nothing was checked.",
        fix=f"Correct `{key}` in {file} (see the configuration section of the README)." if key else f"Correct {file}.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=message, data={"file": file, "key": key}),
        block_on={Severity.CRITICAL},
        key=f"{file}:{key}",
    )
    stage = StageReport(name="configuration", status=stage_status([finding], None), score=0, duration_s=0.0, summary="invalid configuration", findings=[finding])
    return assemble(request, [stage], datetime.now(timezone.utc).isoformat(timespec="seconds"), 0.0, None)

