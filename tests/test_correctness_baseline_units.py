"""training-regression's comparison on hand-made training facts (docs/baseline-comparison.md):
held-out intended changes pass, other ways to break training block, no baseline compares nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.test_perf_units import make_ctx
from traingate.stages.correctness.details import TrainingFacts
from traingate.pipeline.model.schema import Location
from traingate.stages.correctness.probe.payloads import FactsPayload
from traingate.stages.correctness import baseline

FALLBACK = Location(path="train.py", line=1)
STEPS = 20


def facts(losses: list[float], lrs: list[float], rows: tuple[int, int] = (16, 16)) -> TrainingFacts:
    records = [{"step": i, "optimizer": 0, "lrs": [lr], "grad_norms": [1.0], "changes": [0.01]} for i, lr in enumerate(lrs)]
    matrices = [{"name": "0.weight", "rows": rows[0], "distinct": rows[1], "init_site": None}]
    return TrainingFacts.model_validate({"steps": len(lrs), "losses": losses, "records": records, "copied": True, "modules": [], "matrices": matrices})


def falling(start: float, end: float) -> list[float]:
    return [start + (end - start) * i / (STEPS - 1) for i in range(STEPS)]


def schedule(base: float, decay: float) -> list[float]:
    return [base * decay ** (i // 5) for i in range(STEPS)]


BASE = facts(falling(2.0, 0.6), schedule(0.1, 0.5))
PAYLOAD = FactsPayload.model_validate({"steps": STEPS, "records": [], "copied": True, "modules": [], "matrices": [], "scheduler_sites": [], "sites": []})


def compared(tmp_path: Path, now: TrainingFacts, then: TrainingFacts = BASE) -> tuple[list[Any], Any]:
    stage = {"name": "correctness", "details": {"checks": {"training_facts": then.model_dump(mode="json")}}, "metrics": []}
    ctx = make_ctx(tmp_path, {"version": "v1", "environment": {"device": "cpu"}, "stages": [stage]})
    return baseline.compare(ctx, now, PAYLOAD, FALLBACK)


def test_without_a_baseline_nothing_is_compared(tmp_path: Path) -> None:
    assert baseline.compare(make_ctx(tmp_path), BASE, PAYLOAD, FALLBACK) == ([], None)


def test_another_working_learning_rate_and_optimizer_pass_as_changed_not_worse(tmp_path: Path) -> None:
    found, check = compared(tmp_path, facts(falling(2.0, 0.8), schedule(0.02, 0.5)))
    assert found == [] and check.regressions == []
    assert "the learning rate at the last step was 0.0125 in the baseline and 0.0025 now" in check.changed_not_worse


def test_a_schedule_that_never_decays_is_not_worse(tmp_path: Path) -> None:
    found, _ = compared(tmp_path, facts(falling(2.0, 0.7), schedule(0.1, 1.0)))
    assert found == []


def test_a_learning_rate_collapse_blocks_and_says_when_it_began(tmp_path: Path) -> None:
    lrs = schedule(0.1, 0.5)[:8] + [1e-6] * (STEPS - 8)
    found, check = compared(tmp_path, facts(falling(2.0, 0.6), lrs))
    [finding] = found
    assert finding.category.value == "training-regression" and finding.blocking is not False
    assert "0.0125 in the baseline and 1e-06 now (changed after step 8 of 20)" in finding.title


def test_a_loss_that_stops_falling_blocks_with_both_falls(tmp_path: Path) -> None:
    [finding], _ = compared(tmp_path, facts(falling(2.0, 1.8), schedule(0.1, 0.5)))
    assert "fell 65% over 20 steps in the baseline and 9% over 20 now" in finding.title


def test_a_baseline_whose_loss_did_not_fall_judges_no_loss(tmp_path: Path) -> None:
    flat = facts([1.0] * STEPS, schedule(0.1, 0.5))
    found, check = compared(tmp_path, facts([1.0] * STEPS, schedule(0.1, 0.5)), then=flat)
    assert found == [] and "loss fall" in check.compared


def test_rows_made_alike_block_and_a_narrower_layer_does_not(tmp_path: Path) -> None:
    [finding], _ = compared(tmp_path, facts(falling(2.0, 0.6), schedule(0.1, 0.5), rows=(16, 1)))
    assert "`0.weight` had 16 distinct rows of 16 in the baseline and 1 of 16 now" in finding.title
    found, check = compared(tmp_path, facts(falling(2.0, 0.6), schedule(0.1, 0.5), rows=(8, 8)))
    assert found == [] and any("8 of 8 now" in c for c in check.changed_not_worse)


def test_a_baseline_without_facts_is_noted(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, {"version": "v1", "environment": {"device": "cpu"}, "stages": [{"name": "correctness", "details": {}, "metrics": []}]})
    found, check = baseline.compare(ctx, BASE, PAYLOAD, FALLBACK)
    assert found == [] and check is not None and check.ran is False and "no training facts" in (check.note or "")
