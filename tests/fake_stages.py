"""Stages that misbehave on purpose, to prove the orchestrator fails closed."""

from __future__ import annotations

import time
from dataclasses import replace

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity, StageOutcome
from traingate.pipeline.model.registry import rule_for
from traingate.stages.base import StageContext
from traingate.stages.execution.rules import TEST_FAILURE
from traingate.stages.performance.rules import MEMORY_LEAK


class _Fake:
    def __init__(self, name: str) -> None:
        self.name = name
        self.order = 0
        # Its categories are its rules': the one rule it may report (as the execution stage's is).
        self.rules = (replace(rule_for(TEST_FAILURE), stage=name),)


class Clean(_Fake):
    def run(self, ctx: StageContext) -> StageOutcome:
        return StageOutcome(summary="nothing wrong")


class Sleeper(_Fake):
    def run(self, ctx: StageContext) -> StageOutcome:
        time.sleep(3600)  # marker: sleeper-wait
        return StageOutcome(summary="unreachable")


class Raiser(_Fake):
    def run(self, ctx: StageContext) -> StageOutcome:
        raise RuntimeError("stage bug")


class Liar(_Fake):
    """Hands back a low-severity finding that claims to block: against the policy."""

    def run(self, ctx: StageContext) -> StageOutcome:
        finding = Finding.model_construct(
            id="x", stage=ctx.stage, category=TEST_FAILURE, severity=Severity.LOW, title="t",
            location=Location(path="a.py", line=1), problem="p", impact="i", fix="f",
            evidence=Evidence(kind=EvidenceKind.OBSERVED), blocking=True,
        )
        return StageOutcome.model_construct(summary="lies", skipped_reason=None, metrics=[], findings=[finding], details={})


class Trespasser(_Fake):
    """Emits a category that belongs to another stage."""

    def run(self, ctx: StageContext) -> StageOutcome:
        return StageOutcome(summary="x", findings=[ctx.finding(
            category=MEMORY_LEAK, severity=Severity.HIGH, title="t", location=None,
            problem="p", impact="i", fix="f", evidence=Evidence(kind=EvidenceKind.MEASURED),
        )])


class Dier(_Fake):
    def run(self, ctx: StageContext) -> StageOutcome:
        import os

        os._exit(3)


def build() -> dict[str, _Fake]:
    kinds = {"clean": Clean, "sleeper": Sleeper, "raiser": Raiser, "liar": Liar, "trespasser": Trespasser, "dier": Dier}
    return {name: cls(name) for name, cls in kinds.items()}
