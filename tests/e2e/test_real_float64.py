"""A double-precision model (every parameter, gradient and loss float64) through all four
stages: the probes read it in its own precision, so the clean fixture passes every stage
instead of failing closed in the correctness stage's step hook. One gate run, shared."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import GateRun

pytestmark = pytest.mark.slow

STAGES = ["execution", "performance", "concurrency", "correctness"]


@pytest.fixture
def float64_run(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("real_float64_clean")[0]


def test_a_clean_float64_model_passes_every_stage(float64_run: GateRun) -> None:
    run = float64_run
    assert run.returncode == 0 and run.report["decision"] == "PASS", run.stdout + run.stderr
    assert [s["name"] for s in run.report["stages"]] == STAGES
    assert {s["name"]: s["status"] for s in run.report["stages"]} == dict.fromkeys(STAGES, "passed")
    assert run.findings() == []


def test_every_correctness_check_ran_on_the_float64_steps(float64_run: GateRun) -> None:
    checks = float64_run.stage("correctness")["details"]["checks"]
    assert checks["observed"]["steps"] == 24
    assert [r["label"] for r in float64_run.stage("correctness")["details"]["runs"]] == ["instrumented", "accumulated", "large-batch", "overfit-one-batch"]
    accumulation = checks["grad_accumulation"]
    assert accumulation["ran"] is True and accumulation["parameters"] == 6
    # Accumulated and large-batch gradients agree to float64 rounding (about 1e-16): read
    # through float32 they could not agree closer than float32's 1e-7.
    assert accumulation["relative_difference"] < 1e-12
    assert checks["overfit"]["ran"] is True and checks["overfit"]["reduction"] >= checks["overfit"]["required"]


def test_the_other_stages_observed_every_float64_step(float64_run: GateRun) -> None:
    assert float64_run.stage("performance")["details"]["steps"]["observed"] == 24
    concurrency = float64_run.stage("concurrency")["details"]["checks"]
    assert concurrency["gradscaler"]["steps"] == 24 and concurrency["determinism"]["ran"] is True
    smoke = float64_run.stage("execution")["details"]["smoke"]["runs"]
    assert [r["ok"] for r in smoke] == [True] and '"dtype": "torch.float64"' in smoke[0]["returned"]
