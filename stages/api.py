"""The stage API: the one module a stage imports from traingate, built-in or a team's own.

A stage is a subclass of `Stage`, registered in the `traingate.stages` entry-point group
(pyproject.toml; docs/architecture.md). It declares its name, its place in the order, its rules
(each built with keyword arguments: `Rule(category=..., stage=..., ...)`; its categories are
theirs, `Category` objects it declares beside them), and optionally its configuration sections,
its thresholds under the policy (fields marked `Stricter.HIGHER` or `Stricter.LOWER`), its
history metrics, its details model and page template, and the models of its instruments'
payloads (`traingate.pipeline.model.registry.StageDeclaration` lists them, with their defaults).
An attribute the API does not know fails when the stage loads, naming its entry point.

`run(ctx)` runs inside the stage's own agent process and receives a `StageContext`: the target's
copy, its configuration, the policy, the budget; it starts child processes for the target's code
(`run_entrypoint`) and returns a `StageOutcome` of findings (`ctx.finding`) and metrics.

What runs only in the agent (`StageContext`, `run_entrypoint`, `EntrypointRun`) is imported on
first use, so that the gate, which loads every stage's class, does not load it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar

from traingate.pipeline.model.config import MAX_TIMEOUT_S, Stricter
from traingate.pipeline.model.details import Detail, SessionDetails
from traingate.pipeline.model.history import HistoryMetric
from traingate.pipeline.model.registry import StageDeclaration
from traingate.pipeline.model.rules import Rule
from traingate.pipeline.model.schema import Blocks, Category, Evidence, EvidenceKind, Finding, Location, Metric, Severity, StageOutcome

if TYPE_CHECKING:
    from traingate.stages.base import EntrypointRun, StageContext, run_entrypoint

__all__ = [
    "MAX_TIMEOUT_S",
    "Blocks",
    "Category",
    "Detail",
    "EntrypointRun",
    "Evidence",
    "EvidenceKind",
    "Finding",
    "HistoryMetric",
    "Location",
    "Metric",
    "Rule",
    "SessionDetails",
    "Severity",
    "Stage",
    "StageContext",
    "StageOutcome",
    "Stricter",
    "run_entrypoint",
]

# name -> the agent-side module that defines it (imported on first use).
_AGENT_SIDE = {"StageContext": "traingate.stages.base", "run_entrypoint": "traingate.stages.base", "EntrypointRun": "traingate.stages.base"}


class Stage(StageDeclaration):
    """A stage: subclass it, give it `name` and `order`, declare what it has (the attributes of
    `StageDeclaration`) and implement `run`."""

    name: ClassVar[str]
    order: ClassVar[int]

    def run(self, ctx: StageContext) -> StageOutcome:
        """The stage's checks on the target, in its agent process."""
        raise NotImplementedError(f"stage {self.name!r} does not implement run()")


def __getattr__(name: str) -> Any:
    if name not in _AGENT_SIDE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_AGENT_SIDE[name]), name)
