"""Status, score and decision: computed by the parent from what the stages hand back.

Scoring rule (deterministic; docs/contract.md, "Decision and score"). The score reads as the
decision: a BLOCK scores 0-69, a PASS 70-100, so a blocked version never scores above a
passing one.
- a stage that blocks starts at 100 and loses, per finding, critical 40, high 25, medium 10,
  low 3, info 0, and scores at most 69 (never below 0);
- a stage that passes starts at 100 and loses, per distinct problem it reports (every finding
  names one cause, with all its places: `traingate.pipeline.model.findings`), critical 20, high 10,
  medium 5, low 1, info 0, and scores at least 70: its notes lower it, they do not fail it;
- a stage whose status is `error` scores 0; a skipped stage has no score;
- the pipeline score is the lowest score among the stages that ran (0 if none ran), at most
  69 for a BLOCK.

Decision: BLOCK when any finding is blocking or any stage errored; otherwise PASS.
"""

from __future__ import annotations

from traingate.pipeline.model.schema import Category, Decision, Finding, Severity, StageReport, StageStatus

# What a finding costs a stage that blocks.
PENALTY = {
    Severity.CRITICAL: 40,
    Severity.HIGH: 25,
    Severity.MEDIUM: 10,
    Severity.LOW: 3,
    Severity.INFO: 0,
}
# What a problem costs a stage that passes (a high or critical one passes only under a CI
# policy that does not block on its severity).
PASS_PENALTY = {
    Severity.CRITICAL: 20,
    Severity.HIGH: 10,
    Severity.MEDIUM: 5,
    Severity.LOW: 1,
    Severity.INFO: 0,
}
BLOCK_SCORE_CAP = 69
PASS_SCORE_FLOOR = 70

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
    if status is StageStatus.BLOCKED:
        return min(BLOCK_SCORE_CAP, max(0, 100 - sum(PENALTY[f.severity] for f in findings)))
    return max(PASS_SCORE_FLOOR, 100 - sum(PASS_PENALTY[f.severity] for f in findings))


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
