"""Verdicts on few steps: the sign test, the short-series leak rule, and no metric shown as
missed without the finding that explains it."""

from __future__ import annotations


import pytest

from tests.conftest import TARGETS, line_of
from tests.stages.performance.measurements import MACHINE, QUIET_RUN, quiet_timings
from tests.stages.performance.performance_runs import PERFORMANCE, Shared, metric, only
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Metric, PipelineReport, Severity
from traingate.stages.performance.consistency import missed_without_finding, undecided_misses
from traingate.stages.performance.leak import decide
from traingate.stages.performance.sign_test import sign_test
from traingate.stages.performance.rules import MEMORY_LEAK


def test_five_of_five_above_is_decisive_and_four_of_five_is_not() -> None:
    five = sign_test([0.9] * 5, 0.5)
    assert five.p_value == pytest.approx(0.5**5) and five.decisive_above
    four = sign_test([0.9] * 4 + [0.1], 0.5)
    assert four.p_value == pytest.approx(6 / 32) and not four.decisive_above
    assert sign_test([0.1] * 5, 0.5).decisive_below
    assert "p = 0.0312" in five.statement("above")


def test_a_short_series_rising_at_every_step_is_a_leak_with_its_p_value() -> None:
    verdict = decide([5_000_000 + 1024 * i for i in range(6)], min_steps=8)
    assert verdict.leak and "sign test" in verdict.reason and "p = 0.0312" in verdict.reason


def test_a_short_series_with_one_step_under_the_floor_stays_undecided() -> None:
    series = [5_000_000 + 1024 * i for i in range(6)]
    series[3] = series[2] + 10
    assert not decide(series, min_steps=8).leak
    # Five changes are the fewest that can decide at p < 0.05.
    assert not decide([5_000_000 + 1024 * i for i in range(5)], min_steps=8).leak


def _finding(category: Category) -> Finding:
    return Finding(
        id="x", stage="performance", category=category, severity=Severity.HIGH, blocking=True, title="t",
        location=None, problem="p", impact="i", fix="f",
        evidence=Evidence(kind=EvidenceKind.MEASURED, summary="s"),
    )


def test_a_missed_metric_without_its_finding_is_shown_undecided() -> None:
    metrics = [
        Metric(id="data_wait.share.default", name="data wait", value=0.9, threshold=0.5, passed=False, note="n"),
        Metric(id="memory.held_growth", name="growth", value=10.0, threshold=64, passed=False),
    ]
    leak = _finding(MEMORY_LEAK)
    assert [m.id for m in missed_without_finding(metrics, [leak])] == ["data_wait.share.default"]
    lines = undecided_misses(metrics, [leak])
    assert len(lines) == 1 and metrics[0].passed is None and metrics[1].passed is False
    assert missed_without_finding(metrics, [leak]) == []


@pytest.mark.slow
def test_five_profiled_steps_waiting_on_data_are_an_input_stall(shared_gate: Shared) -> None:
    target = TARGETS / "perf_stall_few_steps"
    run = shared_gate("perf_stall_few_steps", *PERFORMANCE)[0]
    assert run.returncode == 1
    stall = only(run, "input-stall")
    assert stall["location"] == {"path": "train.py", "line": line_of(target / "train.py", "marker: filterbank-getitem"), "function": "__getitem__"}
    data = stall["evidence"]["data"]
    assert data["steps"] == 5 and data["sign_test"]["test"] == "one-sided sign test"
    assert data["sign_test"]["p_value"] == pytest.approx(0.5**5)
    assert "sign test" in stall["problem"] and "p = 0.0312" in stall["evidence"]["summary"]
    assert metric(run, "data wait share")["passed"] is False
    # No metric is shown as missed without a finding of its category.
    stage = run.stage("performance")
    raised = {f["category"] for f in stage["findings"]}
    missed = [m["id"] for m in stage["metrics"] if m["passed"] is False]
    assert missed and all(m.startswith("data_wait.") for m in missed) and "input-stall" in raised


class _Ctx:
    """The few attributes `few_steps` reads, and a finding factory that records its call."""

    def __init__(self, baseline: PipelineReport) -> None:
        self.baseline = baseline
        self.made: list[dict] = []

    def finding(self, **kwargs: object) -> dict:
        self.made.append(kwargs)
        return kwargs


def _baseline(median_ms: float, device: str = "cpu") -> PipelineReport:
    """A --baseline report whose performance stage measured this median step time on `device`."""
    stage = {"name": "performance", "status": "passed", "score": 100, "duration_s": 1.0, "summary": "", "metrics": [{"id": "step_time.median.default", "name": "step time", "value": median_ms}],
             "details": {"machine": MACHINE, "runs": [QUIET_RUN]}}
    return PipelineReport.model_validate({
        "tool_version": "0", "task": "t", "version": "v1", "target": {"path": "."}, "started_at": "", "duration_s": 1.0, "decision": "PASS", "score": 100,
        "environment": {"python": "3.11", "torch": None, "device": device, "device_name": device}, "stages": [stage],
    })


def test_five_steps_all_slower_than_the_baseline_are_a_regression_by_the_sign_test() -> None:
    from traingate.stages.performance.regression import few_steps

    ctx = _Ctx(_baseline(1.0))
    row, finding = few_steps(ctx, "default", [0.002] * 5, "cpu", quiet_timings())  # type: ignore[arg-type]
    assert finding is not None and row is not None and row.regressed
    assert row.sign_test is not None and row.sign_test.p_value == pytest.approx(0.5**5)
    # One step within the allowed 10 %: 4 of 5 is not decisive, nothing is reported.
    row, finding = few_steps(_Ctx(_baseline(1.0)), "default", [0.002] * 4 + [0.00105], "cpu", quiet_timings())  # type: ignore[arg-type]
    assert finding is None and row is not None and not row.regressed
    # A baseline from another device is not compared.
    assert few_steps(_Ctx(_baseline(1.0, device="cuda")), "default", [0.002] * 5, "cpu", quiet_timings()) == (None, None)  # type: ignore[arg-type]
    # Stored numbers from a run that recorded no machine are not comparable: listed, never a finding.
    row, finding = few_steps(_Ctx(_baseline(1.0)), "default", [0.002] * 5, "cpu")  # type: ignore[arg-type]
    assert finding is None and row is not None and "did not record the machine" in getattr(row, "reason", "")
