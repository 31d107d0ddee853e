"""The performance stage's details as a model (`traingate.stages.performance.details`).

`tests/schemas/performance_details.json` holds the performance stage's `details` from
`traingate run tests/targets/<name> --stages performance` on a CPU, by fixture
(`perf_stall_few_steps_base` ran with `--baseline` set to a `perf_clean_plain` report, so it
has a median row and a few-step row), with the chart, the table and the loss curves cut to a
few entries. Each validates as `PerformanceDetails` and dumps back to the same JSON, numbers'
types included, and the template renders it; none of this starts the gate.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from tests.report_builders import report, stage
from tests.paths import SCHEMAS
from traingate.stages.performance.details import PerformanceDetails
from traingate.pipeline.gate.outputs import stage_pages
from traingate.reports.render import render_stage_md

SAMPLES: dict[str, dict[str, Any]] = json.loads((SCHEMAS / "performance_details.json").read_text())


def _text(data: dict[str, Any]) -> str:
    """JSON that tells 0 from 0.0 and a missing key from a null one; key order aside."""
    return json.dumps(data, sort_keys=True)


def _render(details: dict[str, Any]) -> str:
    performance = stage("performance").model_copy(update={"details": details})
    return render_stage_md(report([performance]), performance, stage_pages()["performance"])


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_recorded_details_dump_back_to_the_same_json(name: str) -> None:
    details = SAMPLES[name]
    assert _text(PerformanceDetails.model_validate(details).data()) == _text(details)


def test_keys_a_run_left_out_stay_out() -> None:
    few = SAMPLES["perf_stall_few_steps_base"]
    median_row, few_row = few["regression"]["compared"]
    assert "steps" not in median_row and "sign_test" in few_row
    # A stall without a measured step has no sign test; a holder the probe wrote no `steps` for has none.
    leak = copy.deepcopy(SAMPLES["perf_leak_graph"])
    leak["stall"] = {"steps": 0, "median_share": None, "loader": None, "min_steps": 8, "decided": False}
    del leak["memory"]["attribution"]["holder"]["steps"]
    dumped = PerformanceDetails.model_validate(leak).data()
    assert dumped["stall"] == leak["stall"] and "steps" not in dumped["memory"]["attribution"]["holder"]
    assert _text(dumped) == _text(leak)
    # A key the model does not know is an error, not dropped.
    with pytest.raises(ValueError, match="extra"):
        PerformanceDetails.model_validate({**leak, "stalls": None})


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_the_template_reads_the_model(name: str) -> None:
    details = SAMPLES[name]
    text = _render(details)
    assert f"Training device **{details['device']}**" in text
    assert "## Memory held between steps" in text and "## Host-device syncs per step, by call site" in text
    stall = details["stall"]
    if stall["loader"] is not None:
        assert f"Data loader: `{stall['loader']['dataset']}`" in text
        assert f"; {stall['sign_test']['statement']}." in text
    for row in details["regression"]["compared"]:
        assert row["metric"] in text
        if "sign_test" in row:
            assert row["sign_test"]["statement"] in text
    stored = details["memory"]["attribution"]["stored_at"]
    if stored is not None:
        assert f"stored into at `{stored['path']}:{stored['line']}`" in text
    if details["amp"] is not None:
        assert "Matrix products in the instrumented AMP run's steps, by input dtype:" in text


def test_a_stage_without_details_renders_its_metrics_only() -> None:
    text = _render({})
    assert "## What was measured" not in text and "## Metrics" in text
