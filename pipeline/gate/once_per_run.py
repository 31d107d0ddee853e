"""Findings the report shows once per run, whichever stage saw them first.

Every stage runs the same code in the same environment, so some facts come back from each of
them: the training's writes into tracked result files, and the packages the target imports that
this environment lacks. One finding each says it; a later stage adds one only for what is new.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traingate.pipeline.model.schema import Category, Finding, TrainingStopped
from traingate.pipeline.gate.written_files import ResultWrites


@dataclass
class OncePerRun:
    result_writes: ResultWrites = field(default_factory=ResultWrites)
    missing_reported: set[str] = field(default_factory=set)

    def first_seen(self, findings: list[Finding], stopped: list[TrainingStopped]) -> list[Finding]:
        """`findings` less each `environment` finding whose missing modules were all reported
        already, by an earlier stage or earlier in this list. The modules each one names are
        the stage's typed note of it (`StageOutcome.training_stopped`)."""
        missing_by_id = {s.finding: set(s.missing) for s in stopped if s.reason == "environment"}
        kept = []
        for f in findings:
            if f.category is Category.ENVIRONMENT:
                missing = missing_by_id.get(f.id, set())
                if missing and missing <= self.missing_reported:
                    continue
                self.missing_reported |= missing
            kept.append(f)
        return kept
