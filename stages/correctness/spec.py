"""The correctness stage: training bugs that run fine and pass the tests, and (with a baseline) training that got worse than the baseline's.

What the gate knows of it (`traingate.stages.api.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traingate.stages.api import Stage
from traingate.stages.correctness.config import DISTRIBUTED, CorrectnessConfig, CorrectnessPolicy, DistributedConfig
from traingate.stages.correctness.details import CorrectnessDetails
from traingate.stages.correctness.probe.payloads import MODELS
from traingate.stages.correctness.rules import RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.stages.api import StageContext, StageOutcome


class CorrectnessStage(Stage):
    name = "correctness"
    order = 40
    rules = RULES
    config_model = CorrectnessConfig
    # Its torchrun run has a section of its own, `[tool.traingate.distributed]`.
    extra_sections = {DISTRIBUTED: DistributedConfig}
    policy_model = CorrectnessPolicy
    details_model = CorrectnessDetails
    template = Path(__file__).with_name("report.md.j2")
    payload_models = MODELS
    # A run that cannot call the training function skips the stage: nothing to observe.
    purpose = "observe"
    # It reports `steps.observed` from its one instrumented run: `traingate init` checks with it alone.
    checks_steps = True

    agent_modules = ("traingate.stages.correctness.stage",)

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.correctness.stage import CorrectnessWork  # its agent's work only (agent_modules)

        return CorrectnessWork().run(ctx)
