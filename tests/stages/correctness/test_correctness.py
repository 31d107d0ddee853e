"""The correctness stage end to end: one `traingate run --stages correctness` per fixture
target for the session (`shared_gate`), every assertion on its report; a target that
tests/stages/concurrency/test_concurrency.py reads too is run once with both stages, for both files.
Expected lines come from `# marker:` comments."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TARGETS, GateRun, line_of, run_gate

pytestmark = pytest.mark.slow

Shared = Callable[..., tuple[GateRun, float]]
CORRECTNESS = ("--stages", "correctness")


def marker_line(case: str, marker: str) -> int:
    return line_of(TARGETS / case / "train.py", f"# marker: {marker}")


def located(finding: dict[str, Any]) -> tuple[str, int]:
    return finding["location"]["path"], finding["location"]["line"]


def test_clean_training_passes_every_check_including_accumulation(shared_gate: Shared) -> None:
    run = shared_gate("corr_clean", *CORRECTNESS)[0]
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    stage = run.stage("correctness")
    assert stage["status"] == "passed" and run.findings() == []
    checks = stage["details"]["checks"]
    assert checks["observed"]["steps"] == 12
    accumulation = checks["grad_accumulation"]
    assert accumulation["ran"] is True and accumulation["backward_calls_before_step"] == 4
    assert accumulation["relative_difference"] < accumulation["tolerance"]
    assert [r["label"] for r in stage["details"]["runs"]] == ["instrumented", "accumulated", "large-batch"]


def test_warmup_that_starts_at_lr_zero_is_a_low_finding_at_the_loops_lr_assignment(shared_gate: Shared) -> None:
    # One wasted step of a warm-up that starts at 0 by design: reported, not blocking, at the line that set the rate.
    run = shared_gate("corr_lr_warmup", *CORRECTNESS)[0]
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    [finding] = run.findings()
    assert finding["category"] == "ineffective-step" and finding["severity"] == "low" and finding["blocking"] is False
    assert located(finding) == ("train.py", marker_line("corr_lr_warmup", "lr"))
    data = finding["evidence"]["data"]
    assert data["ineffective_steps"] == [0] and data["steps"] == 12 and data["warmup_first_step"] is True
    assert data["first"]["lrs"] == [0.0]
    assert "warm-up starts at lr 0" in finding["title"] and f"train.py:{marker_line('corr_lr_warmup', 'lr')}" in finding["title"]


def test_parameters_outside_the_optimizer_and_without_gradients_are_named_where_built(shared_gate: Shared) -> None:
    run = shared_gate("corr_unused", *CORRECTNESS)[0]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    findings = {f["evidence"]["data"]["reason"]: f for f in run.findings("unused-parameter")}
    assert set(findings) == {"not-in-optimizer", "no-gradient"} and len(run.findings()) == 2
    late, dead = findings["not-in-optimizer"], findings["no-gradient"]
    # At the causes: the optimizer built before the head was attached, and the detach() that cut the gate.
    assert located(late) == ("train.py", marker_line("corr_unused", "optimizer"))
    assert f"train.py:{marker_line('corr_unused', 'late-head')}" in late["problem"]
    assert {p["qualified_name"] for p in late["evidence"]["data"]["parameters"]} == {"head.weight", "head.bias"}
    assert located(dead) == ("train.py", marker_line("corr_unused", "detach")) and "`detach()`" in dead["title"]
    assert f"train.py:{marker_line('corr_unused', 'gate')}" in dead["problem"]
    assert {p["qualified_name"] for p in dead["evidence"]["data"]["parameters"]} == {"encoder.gate.weight", "encoder.gate.bias"}
    assert all(f["blocking"] and f["severity"] == "high" for f in (late, dead))


def test_a_loss_that_overflows_is_reported_at_its_first_non_finite_step(shared_gate: Shared) -> None:
    run = shared_gate("corr_nan", *CORRECTNESS)[0]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "no-learning" and finding["severity"] == "critical" and finding["blocking"] is True
    assert located(finding) == ("train.py", marker_line("corr_nan", "backward"))
    first = finding["evidence"]["data"]["first"]
    assert first["value"] in ("inf", "nan") and 0 < first["step"] < 30
    assert all(v < float("inf") for v in finding["evidence"]["data"]["losses_before"])


def test_unshuffled_training_loaders_are_reported_without_blocking(shared_gate: Shared) -> None:
    run = shared_gate("corr_unshuffled", *CORRECTNESS)[0]
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    findings = run.findings("unshuffled-training")
    assert len(findings) == 2 and len(run.findings()) == 2
    by_kind = {f["evidence"]["data"]["kind"]: f for f in findings}
    assert located(by_kind["sequential"]) == ("train.py", marker_line("corr_unshuffled", "sequential"))
    assert located(by_kind["set-epoch"]) == ("train.py", marker_line("corr_unshuffled", "distributed"))
    assert all(f["severity"] == "medium" and f["blocking"] is False and f["evidence"]["kind"] == "observed" for f in findings)


def test_accumulated_loss_not_divided_gives_a_k_times_larger_gradient(shared_gate: Shared) -> None:
    run = shared_gate("corr_accum", *CORRECTNESS)[0]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "grad-accumulation" and finding["blocking"] is True
    assert located(finding) == ("train.py", marker_line("corr_accum", "backward"))
    data = finding["evidence"]["data"]
    assert data["accumulation"] == 4 and data["batch_size"] == 4
    assert data["gradient_norm_ratio"] == pytest.approx(4.0, rel=1e-3)
    assert data["relative_difference"] > data["tolerance"]


def test_a_run_without_optimizer_steps_fails_closed(tmp_path: Path) -> None:
    target = tmp_path / "no_steps"
    target.mkdir()
    (target / "pyproject.toml").write_text('[tool.traingate]\ntask = "CORR-NO-STEPS"\ntimeout_s = 60\n\n[tool.traingate.entrypoint]\ncall = "train:train"\n')
    (target / "train.py").write_text("import torch\n\n\ndef train():\n    return {'loss': torch.nn.Linear(2, 1)(torch.ones(1, 2)).item()}\n")
    run = run_gate(target, tmp_path / "out", "--stages", "correctness", timeout=300)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "stage-error" and finding["blocking"] is True
    assert "without a single optimizer step" in finding["title"]


def test_without_an_entrypoint_the_stage_is_skipped_with_a_reason(shared_gate: Shared) -> None:
    run = shared_gate("conc_no_entrypoint", *CORRECTNESS)[0]
    stage = run.stage("correctness")
    assert stage["status"] == "skipped" and "no entrypoint is configured" in stage["skipped_reason"]


def test_the_stage_is_skipped_after_the_entrypoint_hung_in_the_execution_stage(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from traingate.pipeline.model.findings import SMOKE_CALL_RUN, hang_finding
    from traingate.pipeline.supervision.isolation import ChildResult
    from traingate.pipeline.gate.orchestrator import _skip_reason
    from traingate.pipeline.model.registry import build_registry, parts
    from traingate.pipeline.model.schema import Severity, StageReport, StageStatus, TrainingStopped

    child = ChildResult(argv=["python"], returncode=-9, timed_out=True, duration_s=5.0, stdout="", stderr="hung")
    hang = hang_finding(SimpleNamespace(stage="execution", root=tmp_path, block_on={Severity.CRITICAL, Severity.HIGH}), child, "The entrypoint smoke call", run=SMOKE_CALL_RUN)
    stopped = [TrainingStopped(finding=hang.id, reason="hang")]
    done = [StageReport(name="execution", status=StageStatus.BLOCKED, score=60, duration_s=1.0, summary="", findings=[hang], training_stopped=stopped)]
    assert "nothing to observe" in (_skip_reason(parts(build_registry()["correctness"]), done) or "")


def test_an_overflow_the_scaler_skips_is_not_a_loss_that_cannot_go_down(shared_gate: Shared) -> None:
    # One iteration's loss is multiplied by inf on purpose; the guard skips that step and the
    # parameters stay finite, so training recovered.
    run = shared_gate("conc_clean_amp", *CORRECTNESS)[0]
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    assert run.findings() == []
    assert run.stage("correctness")["details"]["checks"]["observed"]["steps"] == 3


def test_a_model_that_cannot_fit_one_batch_is_no_learning(shared_gate: Shared) -> None:
    run = shared_gate("corr_overfit", *CORRECTNESS)[0]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    # The cause is seen too: (8, 1) outputs against (8,) targets broadcast in mse_loss.
    [shape] = run.findings("loss-input-mismatch")
    assert located(shape) == ("train.py", marker_line("corr_overfit", "loss")) and shape["blocking"] is True
    assert (shape["evidence"]["data"]["input_shape"], shape["evidence"]["data"]["target_shape"]) == ([8, 1], [8])
    [finding] = run.findings("no-learning")
    assert finding["category"] == "no-learning" and finding["severity"] == "high" and finding["blocking"] is True
    assert finding["evidence"]["kind"] == "measured"
    assert located(finding) == ("train.py", marker_line("corr_overfit", "backward"))
    data = finding["evidence"]["data"]
    assert data["reduction"] < data["required"] == 0.5
    assert data["step_losses"][0] > data["step_losses"][-1] * 0.5  # measured: barely falls


def test_a_model_that_fits_one_batch_passes_and_the_run_stops_at_overfit_steps(shared_gate: Shared) -> None:
    run = shared_gate("corr_overfit_clean", *CORRECTNESS)[0]
    assert run.returncode == 0 and run.report["decision"] == "PASS" and run.findings() == []
    details = run.stage("correctness")["details"]
    check = details["checks"]["overfit"]
    assert check["ran"] is True and check["steps"] == check["limit"] == 12
    assert check["reduction"] >= check["required"]
    assert details["runs"][-1]["label"] == "overfit-one-batch"


def test_correctness_configuration_and_policy(tmp_path: Path) -> None:
    from traingate.pipeline.model.config import PolicyConfig
    from traingate.pipeline.gate.config_file import ConfigError, load_config
    from traingate.pipeline.gate.policy_source import resolve_policy

    (tmp_path / "pyproject.toml").write_text('[tool.traingate.correctness]\naccumulation_kwarg = "accum"\n')
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert "batch_size_kwarg" in info.value.message
    # The target may tighten the correctness thresholds, never loosen them.
    tighter = PolicyConfig.model_validate({"grad_accumulation_tolerance": 0.01, "overfit_min_reduction": 0.9})
    looser = PolicyConfig.model_validate({"grad_accumulation_tolerance": 0.5, "overfit_min_reduction": 0.1})
    policy, _ = resolve_policy(tighter, "pyproject.toml", None)
    assert (policy.grad_accumulation_tolerance, policy.overfit_min_reduction) == (0.01, 0.9)
    policy, provenance = resolve_policy(looser, "pyproject.toml", None)
    assert (policy.grad_accumulation_tolerance, policy.overfit_min_reduction) == (0.05, 0.5)
    assert {"grad_accumulation_tolerance", "overfit_min_reduction"} <= {i.key for i in provenance.ignored}


def test_a_lambda_lr_warmup_from_zero_is_low_at_the_scheduler(shared_gate: Shared) -> None:
    run = shared_gate("corr_sched_warmup", *CORRECTNESS)[0]
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    [finding] = run.findings()
    assert finding["category"] == "ineffective-step" and finding["severity"] == "low" and finding["blocking"] is False
    assert located(finding) == ("train.py", marker_line("corr_sched_warmup", "scheduler"))
    first = finding["evidence"]["data"]["first"]
    assert first["step"] == 0 and first["lrs"] == [0.0]
    assert first["schedulers"] == [f"LambdaLR (built at train.py:{marker_line('corr_sched_warmup', 'scheduler')})"]
    assert "LambdaLR" in finding["problem"]


def test_a_first_step_gradient_that_is_not_finite_is_incomparable_not_a_crash() -> None:
    from traingate.stages.correctness.probe.payloads import FirstUpdatePayload
    from traingate.stages.correctness.accumulation import compare_first_updates

    def first(grad: list[float | None], norm: float | None) -> FirstUpdatePayload:
        return FirstUpdatePayload.model_validate({"stepped": True, "stop": "FirstStepReached", "params": [{"group": 0, "numel": 2, "grad_norm": norm, "grad_sample": grad, "update_norm": None, "update_sample": None}]})

    comparable = compare_first_updates(first([2.0, 4.0], 4.5), first([1.0, 2.0], 2.25))
    assert comparable is not None and comparable["gradient_norm_ratio"] == pytest.approx(2.0)
    # NaN and inf arrive as None after the JSON round trip; float('nan') when read in-process.
    assert compare_first_updates(first([None, 4.0], None), first([1.0, 2.0], 2.25)) is None
    assert compare_first_updates(first([float("nan"), 4.0], 4.5), first([1.0, 2.0], 2.25)) is None
