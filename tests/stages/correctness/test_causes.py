"""ineffective-step naming its cause, and a BYOL-style trainer (an EMA target network under
no_grad in train mode, an unused head in the optimizer), end to end: one `traingate run
--stages correctness` per fixture target, shared by the assertions on its report; expected
lines come from `# marker:` comments.
The decision and each finding's category, severity and line are rows of
tests/e2e/test_fixture_targets.py, which reads the same run; the evidence is checked here."""

from __future__ import annotations

import pytest

from tests.conftest import GateRun
from tests.correctness_runs import checks as _checks
from tests.correctness_runs import CORRECTNESS, Shared
from tests.correctness_runs import located as _located
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


def _cleared_finding(run: GateRun, case: str, steps: int, params: int) -> None:
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()  # the gradient-less parameters are the step's finding, not another one
    assert finding["category"] == "ineffective-step" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker(case, "clear")  # where the fix goes
    data = finding["evidence"]["data"]
    assert data["cause"] == "cleared" and data["ineffective_count"] == data["steps"] == steps
    assert data["ineffective_steps"] == list(range(steps))
    assert _site(data["clear_site"]) == _marker(case, "clear") and _site(data["backward_site"]) == _marker(case, "backward")
    assert _site(data["first"]["site"]) == _marker(case, "step") and data["first"]["grads_after_backward"] == params
    assert f"{steps} of {steps} optimizer step(s)" in finding["title"] and "cleared between the backward and the step" in finding["title"]
    # That cause and only that: no learning-rate schedule, no loss cut from the parameters.
    assert "learning rate" not in finding["problem"] and "schedule" not in finding["problem"] and "does not depend" not in finding["problem"]
    assert "before the backward" in finding["fix"]


def test_a_module_zero_grad_between_backward_and_step_names_the_clearing_line(shared_gate: Shared) -> None:
    cleared = shared_gate("corr_cleared_grads", *CORRECTNESS)[0]
    _cleared_finding(cleared, "corr_cleared_grads", steps=6, params=4)
    assert "Module.zero_grad" in cleared.findings()[0]["problem"]


def test_a_byol_trainer_with_an_ema_target_under_no_grad_and_an_unused_head_passes(shared_gate: Shared) -> None:
    byol = shared_gate("corr_byol", *CORRECTNESS)[0]
    assert byol.returncode == 0 and byol.report["decision"] == "PASS"
    # The target network's forward in train mode under no_grad fed the loss: training, judged so.
    modes = _checks(byol)["train_eval_mode"]
    assert modes["train_under_no_grad"] == 0 and modes["loss_target_forwards"] > 0
    assert byol.findings("train-eval-mode") == []
    # The classification head the method never calls: medium, not blocking, and says so.
    [head] = byol.findings()
    assert head["category"] == "unused-parameter" and head["severity"] == "medium" and head["blocking"] is False
    assert _located(head) == _marker("corr_byol", "head")
    data = head["evidence"]["data"]
    assert data["reason"] == "never-called" and {p["qualified_name"] for p in data["parameters"]} == {"backbone.classifier.weight", "backbone.classifier.bias"}
    assert "reaches no loss" in head["problem"]


def test_the_byol_trainer_clearing_between_backward_and_step_counts_every_step(shared_gate: Shared) -> None:
    """The EMA update moves the target's parameters, which the optimizer holds, between steps:
    every step is still seen to change nothing."""
    byol_cleared = shared_gate("corr_byol_cleared", *CORRECTNESS)[0]
    assert byol_cleared.returncode == 1
    [step] = byol_cleared.findings("ineffective-step")
    assert step["evidence"]["data"]["ineffective_count"] == 8
    assert [f["category"] for f in byol_cleared.findings() if f["blocking"]] == ["ineffective-step"]
    assert _located(step) == _marker("corr_byol_cleared", "clear") and "Optimizer.zero_grad" in step["problem"]
    assert _site(step["evidence"]["data"]["backward_site"]) == _marker("corr_byol_cleared", "backward")
