"""Stale and discarded gradients named at their cause, end to end: a `zero_grad()` that exists
under a condition that was false in the run (stale-gradients at the clear, with its branch),
and a `zero_grad()` at every micro-batch of an accumulation loop (grad-accumulation/
discarded-backward at the clear, with the passes it threw away), each with its clean control.
One `traingate run --stages correctness` per fixture target; expected lines come from
`# marker:` comments.
The decision and each finding's category, severity and line are rows of
tests/e2e/test_fixture_targets.py, which reads the same run; the evidence is checked here."""

from __future__ import annotations

import pytest

from tests.correctness_runs import CORRECTNESS, Shared
from tests.correctness_runs import located as _located
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


def test_a_zero_grad_under_a_false_condition_is_named_with_its_branch(shared_gate: Shared) -> None:
    skipped = shared_gate("corr_skipped_clear", *CORRECTNESS)[0]
    case = "corr_skipped_clear"
    assert skipped.returncode == 1 and skipped.report["decision"] == "BLOCK"
    [finding] = skipped.findings()
    assert finding["category"] == "stale-gradients" and finding["blocking"] is True
    assert _located(finding) == _marker(case, "clear")  # the clearing call, not the step
    [clear] = finding["evidence"]["data"]["skipped_clears"]
    assert (clear["path"], clear["line"]) == _marker(case, "clear")
    assert ("train.py", clear["branch_line"]) == _marker(case, "branch") and clear["branch_code"].startswith("if self.scheduler:")
    assert _site(finding["evidence"]["data"]["step_site"]) == _marker(case, "step")
    assert "7 of 7 optimizer step(s)" in finding["title"] and "never ran" in finding["title"]
    assert "did not run once in 8 optimizer step(s)" in finding["problem"] and "under `if self.scheduler:" in finding["problem"]
    assert f"(line {_marker(case, 'branch')[1]})" in finding["problem"] and "false at every step" in finding["problem"]
    assert "out from under `if self.scheduler:" in finding["fix"]


def test_a_zero_grad_at_every_micro_batch_is_named_with_the_backward_passes_it_threw_away(shared_gate: Shared) -> None:
    discarded = shared_gate("corr_discarded_backward", *CORRECTNESS)[0]
    case = "corr_discarded_backward"
    assert discarded.returncode == 1 and discarded.report["decision"] == "BLOCK"
    [finding] = discarded.findings()  # no baseline: found by its cause
    assert finding["category"] == "grad-accumulation" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker(case, "clear")
    data = finding["evidence"]["data"]
    # 6 steps of 4 micro-batches: 3 of every 4 backward passes cleared before a step read them.
    assert data["discarded_backwards"] == 18 and data["backward_calls"] == 24 and data["clears_discarding"] == 18
    assert _site(data["clear_site"]) == _marker(case, "clear") and data["clear_call"] == "Optimizer.zero_grad"
    assert finding["title"].startswith("18 of 24 backward pass(es)") and "before any optimizer step used them" in finding["title"]
    assert "at every micro-batch" in finding["problem"]
