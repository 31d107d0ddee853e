"""The execution stage: the test suite under coverage (with a baseline: the baseline's form of each test the change edited), and a smoke call of the entrypoint.

What the gate knows of it (`traingate.stages.api.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traingate.stages.api import HistoryMetric, Stage
from traingate.stages.execution.config import ExecutionPolicy
from traingate.stages.execution.details import ExecutionDetails
from traingate.stages.execution.rules import RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.stages.api import StageContext, StageOutcome


class ExecutionStage(Stage):
    name = "execution"
    order = 10
    rules = RULES
    policy_model = ExecutionPolicy
    details_model = ExecutionDetails
    template = Path(__file__).with_name("report.md.j2")
    # It runs whatever happened before: it is what finds out whether the training function runs.
    needs_training = False
    history_metrics = (HistoryMetric(column="Tests passed", ids=("tests.passed",), total="tests.collected"),)

    agent_modules = ("traingate.stages.execution.stage",)

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.execution.stage import ExecutionWork  # its agent's work only (agent_modules)

        return ExecutionWork().run(ctx)
