"""The correctness stage's page (stages/correctness/report.md.j2): its checks, its training facts
and, with a baseline, the loss per step of this version beside the baseline's, drawn."""

from __future__ import annotations

import re
from typing import Any

from tests.report_builders import report, stage
from traingate.pipeline.gate.outputs import stage_pages
from traingate.reports.render import render_stage_md
from traingate.stages.correctness.details import loss_chart

NOTE = {"ran": False, "note": "not configured"}
NOT_APPLICABLE = {"ran": False, "applicable": False, "note": "nothing to judge"}


def _details(losses: list[float | None], baseline: dict[str, Any] | None = None) -> dict[str, Any]:
    checks: dict[str, Any] = {
        "stale_gradients": NOT_APPLICABLE, "train_eval_mode": NOT_APPLICABLE, "loss_input_mismatch": {**NOT_APPLICABLE, "calls": 0},
        "batch_mixing": NOT_APPLICABLE, "grad_accumulation": NOTE, "overfit": NOTE, "distributed": NOTE,
        "training_facts": {"steps": len(losses), "losses": losses, "records": [], "copied": True, "modules": [], "matrices": []},
    }
    if baseline is not None:
        checks["baseline"] = baseline
    return {"device": "cpu", "budget_s": 60.0, "runs": [], "checks": checks}


def _page(details: dict[str, Any]) -> str:
    one = stage("correctness").model_copy(update={"details": details})
    return render_stage_md(report([one]), one, stage_pages()["correctness"])


def _chart_lines(page: str) -> list[list[float]]:
    chart = page.split("```mermaid", 1)[1].split("```", 1)[0]
    return [[float(v) for v in values.split(", ")] for values in re.findall(r"^\s+line \[(.*)\]$", chart, re.M)]


def test_without_a_baseline_the_page_draws_this_runs_loss_alone() -> None:
    page = _page(_details([2.0, 1.5, None, 1.0]))
    assert "## Training" in page and "4 optimizer step(s) observed" in page
    # A step without a number keeps the loss before it; the chart never draws a gap as zero.
    assert _chart_lines(page) == [[2.0, 1.5, 1.5, 1.0]]
    assert "## Against the baseline" not in page
    assert "| stale gradients | no | nothing to judge |" in page


def test_against_a_baseline_both_curves_are_drawn_at_the_same_steps() -> None:
    baseline = {"ran": True, "note": None, "compared": ["loss"], "regressions": ["the training loss fell 60% over 3 steps in the baseline and 1% now"],
                "changed_not_worse": [], "baseline_losses": [2.0, 1.2, 0.8]}
    page = _page(_details([2.0, 1.99, 1.98, 1.97, 1.96], baseline))
    # The first three steps, the ones both runs made: this version's line, then the baseline's.
    assert _chart_lines(page) == [[2.0, 1.99, 1.98], [2.0, 1.2, 0.8]]
    assert "this version, then the baseline" in page
    assert "- ⛔ the training loss fell 60% over 3 steps in the baseline and 1% now" in page


def test_a_baseline_not_compared_says_why_and_draws_one_curve() -> None:
    baseline = {"ran": False, "note": "the baseline report records no training facts", "compared": [], "regressions": [], "changed_not_worse": []}
    page = _page(_details([3.0, 2.0], baseline))
    assert "Not compared: the baseline report records no training facts" in page
    assert len(_chart_lines(page)) == 1


def test_a_long_run_is_drawn_at_evenly_spaced_steps_first_and_last_included() -> None:
    chart = loss_chart([float(1000 - i) for i in range(500)], None, most=60)
    assert chart is not None and len(chart.steps) == 60 and chart.steps[0] == 1 and chart.steps[-1] == 500
    assert chart.now[0] == 1000.0 and chart.now[-1] == 501.0
    assert loss_chart([None, 1.0], None) is None  # one loss is no curve
