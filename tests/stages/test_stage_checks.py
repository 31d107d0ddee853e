"""Every stage's checks have one shape and are listed in one place: `CHECKS` (and, where a
check makes runs of its own, `OWN_RUN_CHECKS`) in the stage's `stage.py`. Each check's record
lands in the stage's details under its name, so a misspelt name would drop it from the report."""

from __future__ import annotations

from typing import Any

import pytest

from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Severity
from traingate.stages.agent.checks import Checked, run_checks
from traingate.stages.concurrency import stage as concurrency
from traingate.stages.concurrency.details import ConcurrencyChecks
from traingate.stages.correctness import stage as correctness
from traingate.stages.correctness.details import CorrectnessChecks
from traingate.stages.correctness.probe import payloads as correctness_payloads
from traingate.stages.execution import stage as execution
from traingate.stages.execution.details import ExecutionDetails
from traingate.stages.performance import stage as performance
from traingate.stages.performance.details import PerformanceDetails
from traingate.stages.performance.probe import payloads as performance_payloads
from traingate.stages.correctness.rules import DATA_LEAKAGE, NO_LEARNING

STAGES = {
    "execution": (execution.CHECKS, ExecutionDetails, {"suite", "leftovers"}),
    "performance": (performance.CHECKS, PerformanceDetails, set()),
    "concurrency": ((*concurrency.CHECKS, *concurrency.OWN_RUN_CHECKS), ConcurrencyChecks, set()),
    "correctness": (
        (*correctness.CHECKS, *correctness.OWN_RUN_CHECKS),
        CorrectnessChecks,
        # Checks that find without a record of their own on the page.
        {"ineffective_step", "unused_parameter", "gradient_clipping", "non_finite", "unshuffled_training", "data_leakage", "discarded_backward", "frozen_output"},
    ),
}


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_every_check_names_what_it_reads_and_where_its_record_goes(stage: str) -> None:
    checks, details, without_record = STAGES[stage]
    names = [check.name for check in checks]
    assert len(set(names)) == len(names), names
    for check in checks:
        assert check.reads and all(isinstance(spec, str) and spec for spec in check.reads), check
        assert callable(check.evaluate)
        assert (check.__doc__ or "").strip(), f"{type(check).__name__} says what it decides"
    recorded = set(names) - without_record
    assert recorded <= set(details.model_fields), recorded - set(details.model_fields)
    assert without_record <= set(names)


def test_the_correctness_stage_installs_what_its_checks_read_and_its_mixing_replay_last() -> None:
    installed = correctness.instruments_read(correctness.CHECKS)
    assert installed[-1] == correctness_payloads.CORRECTNESS_MIXING
    assert set(installed) == {spec for check in correctness.CHECKS for spec in check.reads}
    assert installed[0] == correctness_payloads.CORRECTNESS_STEPS


def test_performance_checks_read_the_profile_and_the_timing_runs() -> None:
    reads = {spec for check in performance.CHECKS for spec in check.reads}
    assert reads == {performance_payloads.PERFORMANCE_FULL, performance_payloads.PERFORMANCE_LIGHT}


def _finding(category: Category) -> Finding:
    return Finding(
        id=category.value, stage="s", category=category, rule=category.value, severity=Severity.LOW, title="t", location=None, problem="p", impact="i", fix="f",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="s"), blocking=False,
    )


class _Finds:
    reads = ("x",)

    def __init__(self, name: str, category: Category, record: Any = None) -> None:
        self.name, self.category, self.record = name, category, record

    def evaluate(self, facts: list[Finding]) -> Checked:
        return Checked([_finding(self.category)], self.record)


class _ReadsEarlier:
    """Records the categories the checks before it found, read through its facts."""

    name, reads = "earlier", ("x",)

    def evaluate(self, facts: list[Finding]) -> Checked:
        return Checked(record=[f.category for f in facts])


def test_run_checks_runs_in_order_and_a_later_check_reads_what_the_earlier_found() -> None:
    findings: list[Finding] = []
    checks = [_Finds("first", NO_LEARNING, "one"), _Finds("second", DATA_LEAKAGE), _ReadsEarlier()]
    records = run_checks(checks, findings, findings)
    assert [f.category for f in findings] == [NO_LEARNING, DATA_LEAKAGE]
    assert records == {"first": "one", "second": None, "earlier": [NO_LEARNING, DATA_LEAKAGE]}
