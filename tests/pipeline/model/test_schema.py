"""The report's contract: categories, evidence rules, fingerprints, scoring."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from traingate.pipeline.gate.policy import BLOCK_SCORE_CAP, PASS_SCORE_FLOOR, decide, stage_score, stage_status
from traingate.pipeline.model.schema import Blocks, Category, Evidence, EvidenceKind, Finding, Location, Severity, StageReport, StageStatus
from traingate.pipeline.model.registry import RegistryError, Stage, build_registry, load_stage, parts, rule_table
from traingate.stages.execution.rules import TEST_FAILURE

SPEC_CATEGORIES = {
    "execution": {"test-failure", "collection-error", "no-tests", "skipped-tests", "test-selection", "test-disabled", "test-weakened", "test-environment", "entrypoint-crash", "entrypoint-untested", "deprecated-api"},
    "performance": {"memory-leak", "host-sync", "amp-speedup", "amp-memory", "amp-accuracy", "amp-inactive", "input-stall", "perf-regression"},
    "concurrency": {"gradscaler-protocol", "nonblocking-race", "nondeterminism", "dataloader-hazard", "stream-race"},
    "correctness": {"ineffective-step", "unused-parameter", "grad-accumulation", "unshuffled-training", "no-learning", "ddp-divergence", "stale-gradients", "train-eval-mode", "loss-input-mismatch", "batch-mixing", "gradient-clipping", "data-leakage", "training-regression"},
    # The spec's, and the gate's own added since: a baseline revision that cannot be had, a run
    # that differs unwatched, a run stopped at its budget while still making progress, a configuration init could not verify.
    "any": {"hang", "stage-error", "config-error", "leftover-process", "target-modified", "environment", "verification-narrowed", "baseline-unavailable", "unwatched-divergence", "budget-overrun", "unverified-configuration"},
}


def _finding(kind: EvidenceKind = EvidenceKind.OBSERVED, severity: Severity = Severity.HIGH, line: int = 10, **kw: object) -> Finding:
    return Finding.create(
        stage="execution", category=TEST_FAILURE, severity=severity, title="t",
        location=Location(path="tests/test_a.py", line=line, function="test_a"), problem="p", impact="i", fix="f",
        evidence=Evidence(kind=kind), block_on={Severity.CRITICAL, Severity.HIGH}, key="tests/test_a.py::test_a", **kw,
    )


def test_categories_are_exactly_the_spec_list() -> None:
    assert {c.value for c in rule_table().categories()} == set().union(*SPEC_CATEGORIES.values())
    # The schema declares the gate's own; each stage declares its own beside its rules.
    assert {c.value for c in Category.builtin()} == SPEC_CATEGORIES["any"]


def test_each_stage_conforms_and_owns_its_spec_categories() -> None:
    registry = build_registry()
    assert tuple(registry) == ("execution", "performance", "concurrency", "correctness")
    for name, stage in registry.items():
        assert isinstance(stage.name, str) and stage.name == name
        assert callable(stage.run)
        assert {c.value for c in parts(stage).categories} <= SPEC_CATEGORIES[name] | SPEC_CATEGORIES["any"]
    seen: set[Category] = set()
    for stage in registry.values():
        own = set(parts(stage).categories) - {Category(c) for c in SPEC_CATEGORIES["any"]}
        assert not own & seen, "a category belongs to one stage"
        seen |= own
    _: list[Stage] = list(registry.values())


def test_a_stage_agent_loads_its_own_stage_by_name_only() -> None:
    for name, stage in build_registry().items():
        own = load_stage(name)
        assert type(own) is type(stage) and own.name == name
    with pytest.raises(RegistryError, match="no stage named 'nonesuch'"):
        load_stage("nonesuch")


def test_static_evidence_is_capped_at_medium_and_never_blocks() -> None:
    f = _finding(kind=EvidenceKind.STATIC, severity=Severity.CRITICAL)
    assert f.severity is Severity.MEDIUM and not f.blocking
    with pytest.raises(ValidationError):
        Finding(**{**f.model_dump(), "blocking": True})
    with pytest.raises(ValidationError):
        Finding(**{**f.model_dump(), "severity": "high"})


def test_blocking_follows_the_policy() -> None:
    assert _finding(severity=Severity.HIGH).blocking
    assert not _finding(severity=Severity.MEDIUM).blocking
    assert not _finding(severity=Severity.CRITICAL, blocks=Blocks.NEVER).blocking
    assert _finding(severity=Severity.LOW, blocks=Blocks.ALWAYS).blocking


def test_findings_are_frozen() -> None:
    f = _finding()
    with pytest.raises(ValidationError):
        f.severity = Severity.LOW  # type: ignore[misc]


def test_fingerprint_survives_moved_lines_but_not_another_defect() -> None:
    assert _finding(line=10).id == _finding(line=42).id
    other = Finding.create(
        stage="execution", category=TEST_FAILURE, severity=Severity.HIGH, title="t",
        location=Location(path="tests/test_a.py", line=10, function="test_a"), problem="p", impact="i", fix="f",
        evidence=Evidence(kind=EvidenceKind.OBSERVED), block_on={Severity.HIGH}, key="tests/test_a.py::test_b",
    )
    assert other.id != _finding().id


def _stage(findings: list[Finding], skipped: str | None = None) -> StageReport:
    status = stage_status(findings, skipped)
    return StageReport(name="s", status=status, score=stage_score(status, findings), duration_s=0, summary="", skipped_reason=skipped, findings=findings)


def test_scoring_rule() -> None:
    assert _stage([]).score == 100
    # A passing stage loses 5 per medium and 1 per low problem.
    assert _stage([_finding(severity=Severity.MEDIUM), _finding(severity=Severity.LOW)]).score == 94
    # A blocking stage loses 40, 25, 10 and 3, and scores at most 69.
    assert _stage([_finding(severity=Severity.HIGH), _finding(severity=Severity.HIGH)]).score == 50
    blocked = _stage([_finding(severity=Severity.HIGH)])
    assert blocked.status is StageStatus.BLOCKED and blocked.score == BLOCK_SCORE_CAP
    decision, score = decide([_stage([]), blocked])
    assert decision.value == "BLOCK" and score == BLOCK_SCORE_CAP
    assert decide([_stage([]), _stage([], skipped="no entrypoint")]) == (decide([_stage([])])[0], 100)


def test_a_pass_with_many_notes_still_scores_above_any_block() -> None:
    """23 low notes (what one per left-out test file gave) read as a pass, not a failing grade."""
    notes = _stage([_finding(severity=Severity.LOW, line=n) for n in range(23)])
    assert notes.status is StageStatus.PASSED and notes.score == 77
    worst_pass = _stage([_finding(severity=Severity.MEDIUM, line=n) for n in range(50)])
    assert worst_pass.score == PASS_SCORE_FLOOR
    best_block = _stage([_finding(severity=Severity.HIGH)])
    assert decide([worst_pass])[1] > decide([best_block])[1] == BLOCK_SCORE_CAP


def test_nothing_ran_is_not_a_pass() -> None:
    decision, score = decide([_stage([], skipped="no entrypoint")])
    assert decision.value == "BLOCK" and score == 0
