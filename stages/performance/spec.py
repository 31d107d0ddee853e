"""The performance stage: memory growth per optimizer step, host-device synchronisations, mixed precision on against off, data-loading stalls, and regressions against the baseline.

What the gate knows of it (`traingate.pipeline.model.registry.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from traingate.stages.performance.config import PerformanceConfig
from traingate.stages.performance.details import PerformanceDetails
from traingate.stages.performance.probe.payloads import MODELS
from traingate.stages.performance.rules import CATEGORIES, RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.pipeline.model.schema import StageOutcome
    from traingate.stages.base import StageContext


class PerformanceStage:
    name = "performance"
    order = 20
    rules = RULES
    categories = CATEGORIES
    config_model: type[BaseModel] | None = PerformanceConfig
    details_model: type[BaseModel] | None = PerformanceDetails
    template: Path | None = Path(__file__).with_name("report.md.j2")
    payload_models: dict[str, type[BaseModel]] = MODELS
    # What it does with the training function: a run that cannot call it skips the stage.
    purpose: str | None = "profile"
    # Its timing runs are timed: no other stage runs beside it (`pipeline.gate.schedule`).
    times_runs = True

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.performance.stage import PerformanceWork  # its agent's work only

        return PerformanceWork().run(ctx)
