"""Status, score and decision: computed by the parent from what the stages hand back.

Scoring rule (deterministic):
- a stage starts at 100 and loses, per finding, critical 40, high 25, medium 10, low 3,
  info 0; it never goes below 0;
- a stage whose status is `error` scores 0; a skipped stage has no score;
- the pipeline score is the lowest score among the stages that ran (0 if none ran);
- a BLOCK never scores above 69, so a blocked version never looks healthy.

Decision: BLOCK when any finding is blocking or any stage errored; otherwise PASS.
"""

from __future__ import annotations

from traingate.pipeline.schema import Category, Decision, Finding, Severity, StageReport, StageStatus

PENALTY = {
    Severity.CRITICAL: 40,
    Severity.HIGH: 25,
    Severity.MEDIUM: 10,
    Severity.LOW: 3,
    Severity.INFO: 0,
}
BLOCK_SCORE_CAP = 69

# Categories that mean the stage itself failed: its status is `error`.
_ERROR_CATEGORIES = {Category.STAGE_ERROR, Category.CONFIG_ERROR}


def stage_status(findings: list[Finding], skipped_reason: str | None) -> StageStatus:
    if any(f.category in _ERROR_CATEGORIES for f in findings):
        return StageStatus.ERROR
    if any(f.blocking for f in findings):
        return StageStatus.BLOCKED
    if skipped_reason is not None:
        return StageStatus.SKIPPED
    return StageStatus.PASSED


def stage_score(status: StageStatus, findings: list[Finding]) -> int | None:
    if status is StageStatus.SKIPPED:
        return None
    if status is StageStatus.ERROR:
        return 0
    return max(0, 100 - sum(PENALTY[f.severity] for f in findings))


def decide(stages: list[StageReport]) -> tuple[Decision, int]:
    blocked = any(
        s.status in (StageStatus.ERROR, StageStatus.BLOCKED) or any(f.blocking for f in s.findings)
        for s in stages
    )
    scores = [s.score for s in stages if s.score is not None]
    score = min(scores) if scores else 0
    if blocked:
        return Decision.BLOCK, min(score, BLOCK_SCORE_CAP)
    if not scores:
        # Nothing ran: fail closed.
        return Decision.BLOCK, 0
    return Decision.PASS, score
