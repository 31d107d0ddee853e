"""The concurrency stage (placeholder until it lands)."""

from __future__ import annotations

from pipeline.schema import Category, StageOutcome
from stages.base import StageContext


class ConcurrencyStage:
    name = "concurrency"
    categories: frozenset[Category] = frozenset()

    def run(self, ctx: StageContext) -> StageOutcome:
        return StageOutcome(summary="not implemented", skipped_reason="this stage is not implemented yet")
