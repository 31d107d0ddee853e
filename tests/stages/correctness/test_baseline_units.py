"""training-regression's comparison on hand-made training facts (docs/baseline-comparison.md):
held-out intended changes pass, other ways to break training block, no baseline compares nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.stages.performance.measurements import make_ctx
from traingate.stages.correctness.details import TrainingFacts
from traingate.pipeline.model.schema import Location
from traingate.stages.correctness.probe.payloads import FactsPayload
from traingate.stages.correctness import baseline
from traingate.stages.correctness.rules import LOSS_INPUT_MISMATCH

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
    assert "fell 65% over 20 steps in the baseline and fell 9% over 20 now" in finding.title


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


def with_facts(base: TrainingFacts, **observed: Any) -> TrainingFacts:
    return TrainingFacts.model_validate({**base.model_dump(mode="json", exclude_unset=True), **observed})


def evaluation(checked: int, deterministic: int, eval_mode: int) -> dict[str, Any]:
    return {"checked": checked, "deterministic": deterministic, "eval_mode": eval_mode, "site": None}


def test_evaluation_outputs_that_differ_now_block_and_fewer_eval_mode_calls_alone_do_not(tmp_path: Path) -> None:
    then = with_facts(BASE, evaluation=evaluation(3, 3, 3))
    [finding], _ = compared(tmp_path, with_facts(BASE, evaluation=evaluation(3, 0, 0)), then)
    assert "the same output in 3 of 3 checks in the baseline and 0 of 3 now (in eval mode: 3 then, 0 now)" in finding.title
    found, check = compared(tmp_path, with_facts(BASE, evaluation=evaluation(3, 3, 0)), then)
    assert found == [] and any("3 of 3 now" in c for c in check.changed_not_worse)


def test_a_quarter_of_the_samples_per_epoch_blocks_and_another_batch_size_does_not(tmp_path: Path) -> None:
    then = with_facts(BASE, samples_per_epoch=384)
    [finding], _ = compared(tmp_path, with_facts(BASE, samples_per_epoch=96), then)
    assert "handed out 384 samples per epoch in the baseline and 96 now" in finding.title
    found, check = compared(tmp_path, with_facts(BASE, samples_per_epoch=380), then)  # drop_last with another batch size
    assert found == [] and "samples per epoch" in check.compared


def loss_input(kind: str, function: str = "cross_entropy", classes: int = 4) -> list[dict[str, Any]]:
    return [{"function": function, "kind": kind, "shape": [32, classes], "dtype": "float32"}]


def test_a_loss_given_the_kind_it_does_not_expect_blocks_unless_its_named_rule_found_it(tmp_path: Path) -> None:
    then = with_facts(BASE, loss_inputs=loss_input("logits"))
    [finding], _ = compared(tmp_path, with_facts(BASE, loss_inputs=loss_input("probabilities")), then)
    assert "`cross_entropy` was given logits of shape [32, 4] (float32) in the baseline and probabilities of shape [32, 4] (float32) now" in finding.title
    stage = {"name": "correctness", "details": {"checks": {"training_facts": then.model_dump(mode="json")}}, "metrics": []}
    ctx = make_ctx(tmp_path, {"version": "v1", "environment": {"device": "cpu"}, "stages": [stage]})
    found, check = baseline.compare(ctx, with_facts(BASE, loss_inputs=loss_input("probabilities")), PAYLOAD, FALLBACK, {LOSS_INPUT_MISMATCH})
    assert found == [] and check is not None and any("stated in the loss-input-mismatch finding" in r for r in check.regressions)


def test_log_probabilities_and_more_classes_are_changed_not_worse(tmp_path: Path) -> None:
    then = with_facts(BASE, loss_inputs=loss_input("logits"))
    found, check = compared(tmp_path, with_facts(BASE, loss_inputs=loss_input("log-probabilities", classes=10)), then)
    assert found == [] and any("log-probabilities of shape [32, 10]" in c for c in check.changed_not_worse)
    found, _ = compared(tmp_path, with_facts(BASE, loss_inputs=loss_input("logits", "nll_loss")), with_facts(BASE, loss_inputs=loss_input("log-probabilities", "nll_loss")))
    assert [f.title for f in found] == ["`nll_loss` was given log-probabilities of shape [32, 4] (float32) in the baseline and logits of shape [32, 4] (float32) now"]


def modules(*changes: float) -> list[dict[str, Any]]:
    return [{"module": str(i), "change": change} for i, change in enumerate(changes)]


def test_modules_that_stopped_changing_are_one_finding_and_a_slower_learning_rate_is_not_worse(tmp_path: Path) -> None:
    then = with_facts(BASE, modules=modules(0.5, 2.0))
    [finding], _ = compared(tmp_path, with_facts(BASE, modules=modules(0.0005, 0.002)), then)
    assert finding.title.startswith("Module `0` changed by 0.5 over the run in the baseline and by 0.0005 now; module `1` changed by 2")
    found, check = compared(tmp_path, with_facts(BASE, modules=modules(0.05, 0.2)), then)  # 10 times lower
    assert found == [] and len([c for c in check.changed_not_worse if c.startswith("module")]) == 2
    found, check = compared(tmp_path, with_facts(BASE, modules=modules(0.5)), then)  # `1` held by no optimizer, no named rule found it
    assert found == [] and any("`1` changed by 2 over the run in the baseline and is held by no optimizer now" in c for c in check.changed_not_worse)


def test_a_loss_that_rose_is_said_to_have_risen() -> None:
    assert baseline._moved(0.58) == "fell 58%" and baseline._moved(-0.07) == "rose 7%" and baseline._moved(0.0) == "fell 0%"
