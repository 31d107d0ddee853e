"""The concurrency stage: GradScaler protocol misuse, `non_blocking` copy races, nondeterminism between same-seed runs, DataLoader worker hazards, CUDA stream races.

What the gate knows of it (`traingate.stages.api.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traingate.stages.api import Stage
from traingate.stages.concurrency.config import ConcurrencyConfig
from traingate.stages.concurrency.details import ConcurrencyDetails
from traingate.stages.concurrency.probe.payloads import MODELS
from traingate.stages.concurrency.rules import RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.stages.api import StageContext, StageOutcome


class ConcurrencyStage(Stage):
    name = "concurrency"
    order = 30
    rules = RULES
    config_model = ConcurrencyConfig
    details_model = ConcurrencyDetails
    template = Path(__file__).with_name("report.md.j2")
    payload_models = MODELS
    # A run that cannot call the training function skips the stage: nothing to observe.
    purpose = "observe"

    agent_modules = ("traingate.stages.concurrency.stage",)

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.concurrency.stage import ConcurrencyWork  # its agent's work only (agent_modules)

        return ConcurrencyWork().run(ctx)
