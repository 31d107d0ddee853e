"""The concurrency and correctness stages' details as models: what real runs recorded in
report.json reads back into the models and dumps to the same JSON, and the concurrency report
renders from the model exactly as its template rendered the plain details.

The samples (`tests/schemas/stage_details.json`) are the `details` of real runs of the fixture
targets (and the bundled example), recorded before the details had models, with the part of
the concurrency report they render (from the first section to the metrics) as it was then.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from tests.report_builders import report, stage
from tests.paths import SCHEMAS
from traingate.stages.concurrency.details import ConcurrencyDetails, DeterminismDetails, LoaderDetails, ProtocolDetails
from traingate.stages.correctness.details import CorrectnessDetails, DistributedCheck
from traingate.pipeline.gate.outputs import stage_pages
from traingate.reports.render import render_stage_md

PAGES = stage_pages()
STAGE_DETAILS = {name: page.details_model for name, page in PAGES.items() if page.details_model is not None}

SAMPLES: dict[str, list[dict[str, Any]]] = json.loads((SCHEMAS / "stage_details.json").read_text())
CONCURRENCY = SAMPLES["concurrency"]
CORRECTNESS = SAMPLES["correctness"]


def _section(markdown: str) -> str:
    """The part of a stage report its details render: from the first section to the metrics."""
    start, end = markdown.find("\n## "), markdown.find("\n## Metrics")
    return markdown[start:end] if start < end else ""


@pytest.mark.parametrize("sample", CONCURRENCY, ids=[s["run"] for s in CONCURRENCY])
def test_concurrency_details_read_back_and_dump_the_same(sample: dict[str, Any]) -> None:
    details = ConcurrencyDetails.model_validate(sample["details"])
    assert details.as_json() == sample["details"]
    # Through report.json's text too: the dump is plain JSON.
    assert ConcurrencyDetails.model_validate_json(json.dumps(sample["details"])).as_json() == sample["details"]


@pytest.mark.parametrize("sample", CORRECTNESS, ids=[s["run"] for s in CORRECTNESS])
def test_correctness_details_read_back_and_dump_the_same(sample: dict[str, Any]) -> None:
    details = CorrectnessDetails.model_validate(sample["details"])
    assert details.as_json() == sample["details"]
    assert CorrectnessDetails.model_validate_json(json.dumps(sample["details"])).as_json() == sample["details"]


@pytest.mark.parametrize("sample", CONCURRENCY, ids=[s["run"] for s in CONCURRENCY])
def test_the_concurrency_report_renders_as_it_did_from_plain_details(sample: dict[str, Any]) -> None:
    one = stage("concurrency").model_copy(update={"details": sample["details"]})
    assert _section(render_stage_md(report([one]), one, PAGES.get(one.name))) == sample["markdown"]


@pytest.mark.parametrize("sample", CORRECTNESS, ids=[s["run"] for s in CORRECTNESS])
def test_the_correctness_report_renders_with_its_details(sample: dict[str, Any]) -> None:
    one = stage("correctness").model_copy(update={"details": sample["details"]})
    assert "## Metrics" in render_stage_md(report([one]), one, PAGES.get(one.name))


def test_each_check_reads_back_as_the_record_it_was() -> None:
    """A check that ran is its own record, one that did not its note; the unions never mix them up."""
    concurrency = {s["run"]: s["details"] for s in CONCURRENCY}
    correctness = {s["run"]: s["details"] for s in CORRECTNESS}
    ran = ConcurrencyDetails.model_validate(concurrency["conc_hashorder"]).checks
    assert ran is not None and isinstance(ran.gradscaler, ProtocolDetails) and isinstance(ran.dataloader, LoaderDetails)
    assert isinstance(ran.determinism, DeterminismDetails) and ran.determinism.kind == "hash-order" and ran.determinism.curves
    hung = ConcurrencyDetails.model_validate(concurrency["conc_hang"])
    assert hung.stopped and hung.checks is not None and not hung.checks.gradscaler.ran and not hung.checks.determinism.ran
    distributed = CorrectnessDetails.model_validate(correctness["corr_ddp_skipped_collective"]).checks
    assert distributed is not None and isinstance(distributed.distributed, DistributedCheck)
    assert distributed.distributed.ranks and distributed.distributed.steps_per_rank is None  # the ranks hung: nothing compared
    failed = CorrectnessDetails.model_validate(correctness["conc_hang"]).checks
    assert failed is not None and failed.observed is None


def test_a_skipped_stage_has_no_details_to_render() -> None:
    for name in ("concurrency", "correctness"):
        assert STAGE_DETAILS[name].model_validate({}).model_dump(exclude_unset=True) == {}
        skipped = stage(name, skipped="no entrypoint configured")
        assert "**Not run:** no entrypoint configured" in render_stage_md(report([skipped]), skipped, PAGES.get(skipped.name))


def test_a_record_of_another_shape_is_refused() -> None:
    details = json.loads(json.dumps(CONCURRENCY[0]["details"]))
    details["checks"]["gradscaler"]["calls"] = 3  # a key no record has
    with pytest.raises(ValidationError):
        ConcurrencyDetails.model_validate(details)
    details = json.loads(json.dumps(CORRECTNESS[0]["details"]))
    del details["checks"]["grad_accumulation"]["tolerance"]
    with pytest.raises(ValidationError):
        CorrectnessDetails.model_validate(details)
