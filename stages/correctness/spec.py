"""The correctness stage: training bugs that run fine and pass the tests, and (with a baseline) training that got worse than the baseline's.

What the gate knows of it (`traingate.pipeline.model.registry.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from traingate.stages.correctness.config import CorrectnessConfig
from traingate.stages.correctness.details import CorrectnessDetails
from traingate.stages.correctness.probe.payloads import MODELS
from traingate.stages.correctness.rules import CATEGORIES, RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.pipeline.model.schema import StageOutcome
    from traingate.stages.base import StageContext


class CorrectnessStage:
    name = "correctness"
    order = 40
    rules = RULES
    categories = CATEGORIES
    config_model: type[BaseModel] | None = CorrectnessConfig
    details_model: type[BaseModel] | None = CorrectnessDetails
    template: Path | None = Path(__file__).with_name("report.md.j2")
    payload_models: dict[str, type[BaseModel]] = MODELS
    # What it does with the training function: a run that cannot call it skips the stage.
    purpose: str | None = "observe"
    # It reports `steps.observed` from its one instrumented run: `traingate init` checks with it alone.
    checks_steps = True

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.correctness.stage import CorrectnessWork  # its agent's work only

        return CorrectnessWork().run(ctx)
