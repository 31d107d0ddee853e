"""The execution stage: the test suite under coverage (with a baseline: the baseline's form of each test the change edited), and a smoke call of the entrypoint.

What the gate knows of it (`traingate.pipeline.model.registry.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from traingate.stages.execution.details import ExecutionDetails
from traingate.stages.execution.rules import CATEGORIES, RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.pipeline.model.schema import StageOutcome
    from traingate.stages.base import StageContext


class ExecutionStage:
    name = "execution"
    order = 10
    rules = RULES
    categories = CATEGORIES
    config_model: type[BaseModel] | None = None
    details_model: type[BaseModel] | None = ExecutionDetails
    template: Path | None = Path(__file__).with_name("report.md.j2")
    payload_models: dict[str, type[BaseModel]] = {}
    # What it does with the training function: a run that cannot call it skips the stage.
    purpose: str | None = None  # it is what finds that out

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.execution.stage import ExecutionWork  # its agent's work only

        return ExecutionWork().run(ctx)
