"""The performance stage: memory growth per optimizer step, host-device synchronisations, mixed precision on against off, data-loading stalls, and regressions against the baseline.

What the gate knows of it (`traingate.stages.api.Stage`); its work is `stage.py`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from traingate.stages.api import HistoryMetric, Stage
from traingate.stages.performance.config import PerformanceConfig, PerformancePolicy
from traingate.stages.performance.details import PerformanceDetails
from traingate.stages.performance.probe.payloads import MODELS
from traingate.stages.performance.rules import RULES

if TYPE_CHECKING:  # the agent's context: imported only where the stage runs
    from traingate.stages.api import StageContext, StageOutcome


class PerformanceStage(Stage):
    name = "performance"
    order = 20
    rules = RULES
    config_model = PerformanceConfig
    policy_model = PerformancePolicy
    details_model = PerformanceDetails
    template = Path(__file__).with_name("report.md.j2")
    payload_models = MODELS
    # A run that cannot call the training function skips the stage: nothing to profile.
    purpose = "profile"
    # Its timing runs are timed: they come first, alone; the stages after it start beside the rest (`pipeline.gate.schedule`).
    times_runs = True
    history_metrics = (
        # The full-precision run's step time where there is one.
        HistoryMetric(
            column="Step time", ids=("step_time.median.fp32", "step_time.median.amp"), prefix="step_time.median.", unit=" ms", variant=True,
            chart="step time (ms)", chart_title="median step time (ms)",
        ),
        HistoryMetric(column="Memory growth", ids=("memory.held_growth",), unit=" B/step"),
        HistoryMetric(column="AMP speedup", ids=("amp.speedup",), unit="x"),
    )

    agent_modules = ("traingate.stages.performance.stage",)

    def run(self, ctx: StageContext) -> StageOutcome:
        from traingate.stages.performance.stage import PerformanceWork  # its agent's work only (agent_modules)

        return PerformanceWork().run(ctx)
