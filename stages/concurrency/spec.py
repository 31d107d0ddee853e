"""The concurrency stage: GradScaler protocol misuse, `non_blocking` copy races, nondeterminism between same-seed runs, DataLoader worker hazards, CUDA stream races.

What the gate knows of it (`traingate.pipeline.model.registry.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel

from traingate.stages.concurrency.config import ConcurrencyConfig
from traingate.stages.concurrency.details import ConcurrencyDetails
from traingate.stages.concurrency.probe.payloads import MODELS
from traingate.stages.concurrency.rules import CATEGORIES, RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.pipeline.model.schema import StageOutcome
    from traingate.stages.base import StageContext


class ConcurrencyStage:
    name = "concurrency"
    order = 30
    rules = RULES
    categories = CATEGORIES
    config_model: type[BaseModel] | None = ConcurrencyConfig
    details_model: type[BaseModel] | None = ConcurrencyDetails
    template: Path | None = Path(__file__).with_name("report.md.j2")
    payload_models: dict[str, type[BaseModel]] = MODELS
    # What it does with the training function: a run that cannot call it skips the stage.
    purpose: str | None = "observe"

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.concurrency.stage import ConcurrencyWork  # its agent's work only

        return ConcurrencyWork().run(ctx)
