"""What every stage agent does before its stage runs, done once where the agents fork from.

A stage agent forked from the gate run's agents' host (`pipeline/supervision/warm.py:
AgentHost`) would otherwise import the gate's models, build every registered stage's
declaration (their pydantic models) and parametrize its request's model on its own: about half
a second of CPU per agent, the same in each. The host calls `prepare` after its imports, and
an import server does it once for all the hosts it forks (`pipeline/supervision/import_server.py`),
so each agent finds it done. The host's forks that run target code forget these modules
(`stages/harness/fork_server.py`), so no process of the target's sees the gate's name in
`sys.modules`.
"""

from __future__ import annotations

import importlib

# The modules `__main__` imports (not `__main__` itself: runpy would warn about running a
# module already imported).
AGENT_MODULES = (
    "traingate.pipeline.model.config",
    "traingate.pipeline.model.registry",
    "traingate.pipeline.model.schema",
    "traingate.pipeline.supervision.disguise",
    "traingate.pipeline.supervision.processes",
    "traingate.pipeline.supervision.warm",
    "traingate.pipeline.supervision.warm_pool",
    "traingate.stages.base",
    "traingate.stages.common.channel",
    "traingate.stages.common.guard",
    "traingate.stages.common.inherited",
    "traingate.stages.common.reads",
    "traingate.stages.contract.messages",
)


def prepare(every_stage: bool = False) -> None:
    """Import what an agent imports, load the registered stages' declarations (cached for the
    process: `build_registry`) and build the models an agent's request and reply are read and
    written with. With `every_stage` (an import server: the hosts it forks serve many runs),
    also each stage's own work (`agent_modules`) and every model its payloads and details are
    checked with, which an agent would import and build when its stage runs; a host started
    for one run leaves those to the agents of the stages it runs."""
    for name in AGENT_MODULES:
        importlib.import_module(name)
    from traingate.pipeline.model.config import TargetConfig
    from traingate.pipeline.model.registry import build_deferred_models, build_registry, parts
    from traingate.pipeline.model.schema import PipelineReport, StageOutcome
    from traingate.stages.contract.messages import AgentReply, AgentRequest

    stages = build_registry()
    AgentRequest[TargetConfig, PipelineReport]  # pydantic caches the parametrized model
    AgentReply[StageOutcome]
    if every_stage:
        for stage in stages.values():
            for name in parts(stage).agent_modules:
                importlib.import_module(name)
        build_deferred_models()
