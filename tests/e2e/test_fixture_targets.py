"""What each fixture target must report, as a table: one row per target and stages, checked by
one parametrized test that reads the session's run of that target (`shared_gate`, the run the
stage's own tests read for their evidence).

A row gives the decision and every finding of the stages it names, each as its category,
severity, whether it blocks, and where it points: a path and the text of the line (a
`# marker:` comment in the fixture source), found in the file, never a hard-coded number. A
clean control is a row with no findings. What a finding's evidence holds stays with the tests
of its stage, which read the same run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.conftest import TARGETS, GateRun, line_of


@dataclass(frozen=True)
class Found:
    """One finding a planted defect must produce, located at the line holding `marker`."""

    category: str
    severity: str
    blocking: bool
    marker: str
    path: str = "train.py"


@dataclass(frozen=True)
class Expected:
    target: str
    stages: str
    decision: str
    findings: tuple[Found, ...] = ()


def correctness(target: str, decision: str, *findings: Found) -> Expected:
    return Expected(target, "correctness", decision, findings)


def concurrency(target: str, decision: str, *findings: Found) -> Expected:
    return Expected(target, "concurrency", decision, findings)


def high(category: str, marker: str) -> Found:
    return Found(category, "high", True, marker)


EXPECTED = [
    # -- the correctness stage: causes located where the user wrote them
    correctness("corr_loss_softmax_functional", "BLOCK", high("loss-input-mismatch", "loss")),
    correctness("corr_frozen_fc", "BLOCK", high("unused-parameter", "freeze")),
    correctness("corr_frozen_fc_clean", "PASS"),
    correctness("corr_head_unused", "PASS", Found("unused-parameter", "medium", False, "head")),
    correctness("corr_head_detached", "BLOCK", high("unused-parameter", "detach")),
    correctness("corr_encoder_no_grad", "BLOCK", high("unused-parameter", "no-grad")),
    correctness("corr_optimizer_encoder_only", "BLOCK", high("unused-parameter", "optimizer")),
    correctness("corr_optimizer_encoder_only_clean", "PASS"),
    correctness("corr_log_prob_shape", "BLOCK", high("loss-input-mismatch", "log-prob")),
    correctness("corr_log_prob_shape_clean", "PASS"),
    correctness("corr_warmup_zero_steps", "BLOCK", high("ineffective-step", "step")),
    correctness("corr_eval_mid_epoch", "BLOCK", high("train-eval-mode", "eval")),
    correctness("corr_eval_mid_epoch_clean", "PASS"),
    # -- silent bugs, each with its clean control
    correctness("corr_loss_shape", "BLOCK", high("loss-input-mismatch", "loss")),
    correctness("corr_loss_shape_clean", "PASS"),
    correctness("corr_dropout_eval", "BLOCK", high("train-eval-mode", "dropout")),
    correctness("corr_dropout_eval_clean", "PASS"),
    correctness("corr_clip_early", "BLOCK", high("gradient-clipping", "clip")),
    correctness("corr_clip_early_clean", "PASS"),
    correctness("corr_leakage", "BLOCK", high("data-leakage", "val-loader")),
    correctness("corr_leakage_clean", "PASS"),
    correctness("corr_frozen_head", "BLOCK", high("unused-parameter", "freeze")),
    correctness("corr_frozen_head_clean", "PASS"),
    # -- gradients cleared, skipped or discarded
    correctness("corr_cleared_grads_clean", "PASS"),
    correctness("corr_skipped_clear_clean", "PASS"),
    correctness("corr_discarded_backward_clean", "PASS"),
    correctness("corr_stale_grads", "BLOCK", high("stale-gradients", "step")),
    correctness("corr_stale_grads_accum", "PASS"),
    correctness("corr_eval_mode_clean", "PASS"),
    # -- the concurrency stage: protocol misuse, nondeterminism and loader hazards
    concurrency("conc_clip", "BLOCK", high("gradscaler-protocol", "clip-before-unscale")),
    concurrency("conc_scaler_misuse", "BLOCK", *(high("gradscaler-protocol", m) for m in ("step-bypasses-scaler", "missing-update", "unscale-twice"))),
    concurrency("conc_hashorder", "BLOCK", high("nondeterminism", "set-iteration")),
    concurrency("conc_lambda_dataset", "BLOCK", high("dataloader-hazard", "lambda")),
    concurrency("conc_seeded_loader", "PASS"),
    concurrency("conc_persistent", "PASS", Found("dataloader-hazard", "medium", False, "recreated")),
    # a rerun that fails where run 1 returned is that failure, at its line, not a divergence
    concurrency("conc_rerun_crash", "BLOCK", Found("entrypoint-crash", "critical", True, "rerun-crash")),
    # run 1 stopped by its loader's worker: that one finding, and no runs compared
    concurrency("conc_worker_raises", "BLOCK", high("dataloader-hazard", "worker-raises")),
]


def _seen(finding: dict[str, Any]) -> tuple[str, str, bool, str | None, int | None]:
    location = finding["location"] or {}
    return finding["category"], finding["severity"], finding["blocking"], location.get("path"), location.get("line")


def _expected(row: Expected, found: Found) -> tuple[str, str, bool, str, int]:
    line = line_of(TARGETS / row.target / found.path, f"# marker: {found.marker}")
    return found.category, found.severity, found.blocking, found.path, line


@pytest.mark.parametrize("row", EXPECTED, ids=[f"{row.target}-{row.stages.replace(',', '+')}" for row in EXPECTED])
def test_the_fixture_target_reports_what_was_planted(row: Expected, shared_gate: Callable[..., tuple[GateRun, float]]) -> None:
    run, _ = shared_gate(row.target, "--stages", row.stages)
    assert run.report["decision"] == row.decision and run.returncode == (0 if row.decision == "PASS" else 1), run.stdout + run.stderr
    found = [f for stage in row.stages.split(",") for f in run.findings(stage=stage)]
    assert sorted(map(_seen, found), key=str) == sorted((_expected(row, f) for f in row.findings), key=str), [f["title"] for f in found]
