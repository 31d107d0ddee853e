"""`traingate init`: the check run of a proposal, and what it showed.

A check runs the proposal as `traingate run` would, on a snapshot of the target, in stage agents
and their child processes under the probes, within `--budget` seconds: an entry point under the
registered stage that reports the optimizer steps it observed; with the tests' training
observed instead, the execution stage (which picks the tests) and that stage after it.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingate.pipeline.gate.init_propose import ENOUGH_STEPS, Candidate
from traingate.pipeline.gate.orchestrator import RunRequest, run_pipeline
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.registry import build_registry, rule_table, step_checking_stage
from traingate.pipeline.model.schema import ObservedTraining, PipelineReport


@dataclass
class CheckResult:
    """What the check run of one candidate showed."""

    steps: int | None  # optimizer steps the correctness stage observed; None: not measured
    duration_s: float
    problems: list[str] = field(default_factory=list)  # crash, hang, stage error: why it fell short
    findings: int = 0  # other findings of the run, which `traingate run` reports
    observed: ObservedTraining | None = None  # with no entrypoint: the tests whose training was observed

    @property
    def enough(self) -> bool:
        return not self.problems and self.steps is not None and self.steps >= ENOUGH_STEPS


@dataclass
class InitOutcome:
    text: str | None  # the file, None when nothing was found
    chosen: Candidate | None
    check: CheckResult | None
    messages: list[str]  # for the terminal: what was decided, what was not
    verified: bool = False  # the check run observed what the file says it runs


def check_run(root: Path, candidate: Candidate, device: str, budget_s: float) -> CheckResult:
    """Run the candidate under the correctness stage's probes, as `traingate run` would."""
    return run_check(root, {"tests": False, "timeout_s": budget_s, "entrypoint": {**candidate.entrypoint, "kwargs": candidate.kwargs}}, [step_checking_stage()], device)


def run_check(root: Path, config: dict[str, Any], stages: list[str], device: str) -> CheckResult:
    out = Path(tempfile.mkdtemp(prefix="traingate-init-"))
    try:
        request = RunRequest(root=root, task="init", version="check", stages=stages, out=out, device=device)
        return read_check(run_pipeline(request, TargetConfig.model_validate(config), build_registry()))
    finally:
        shutil.rmtree(out, ignore_errors=True)


def read_check(report: PipelineReport) -> CheckResult:
    stage = next(s for s in report.stages if s.name == step_checking_stage())
    steps = next((m.value for m in stage.metrics if m.id == "steps.observed"), None)
    # What stops the training run: the target's code crashing in the stage's run (the categories
    # any stage may report), a hang, the stage failing, packages missing, processes left behind.
    stopping = {c.value for c in rule_table().reported_by_any_stage()} | {"hang", "budget-overrun", "stage-error", "environment", "leftover-process"}
    problems = [
        f"{f.category}: {f.title}" + (f" ({f.location.path}:{f.location.line})" if f.location and f.location.line else "")
        for s in report.stages for f in s.findings if str(f.category) in stopping
    ]
    if stage.skipped_reason:
        problems.append(f"the check was skipped: {stage.skipped_reason}")
    others = sum(1 for f in stage.findings if str(f.category) not in stopping)
    return CheckResult(int(steps) if isinstance(steps, (int, float)) else None, report.duration_s, problems, others, report.observed_training)


def missing_package(result: CheckResult) -> bool:
    """The check stopped only because a package the training imports is not installed here."""
    return bool(result.problems) and all("ModuleNotFoundError" in p or p.startswith("environment") for p in result.problems)
