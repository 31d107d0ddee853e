"""The agent process of one stage: `python -P -m traingate.stages.agent < AgentRequest (JSON on stdin)`.

It runs the stage and hands the stage's outcome back over the channel named in the request
(`traingate.stages.common.channel`: a pipe, with the run's nonce); the parent validates it
and computes status, score and decision itself. An exception here is handed back as an error
record so the parent can report it; the parent fails closed on anything else.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from pkgutil import resolve_name

from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.supervision.disguise import Disguise
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.pipeline.supervision.warm import TEST_RUN_IMPORTS, enabled as warm_start_enabled
from traingate.pipeline.supervision.processes import become_subreaper
from traingate.pipeline.model.registry import build_registry, load_stage, parts
from traingate.pipeline.model.schema import PipelineReport, StageOutcome
from traingate.stages.base import StageContext
from traingate.stages.common.channel import receive_request
from traingate.stages.contract.messages import AGENT_REPLY, MACHINE_RELEASED, AgentReply, AgentRequest
from traingate.stages.common import guard, inherited
from traingate.stages.common.reads import combined


def _handed_down(mask: Disguise | None) -> inherited.InheritedWarm | None:
    """The interpreter handed down to this agent: the fork's code that hands it down is the
    run's copy's (`pipeline/supervision/disguise.py`) when the gate's host ran one, so its record is in
    that copy's module, in this process's memory."""
    found = inherited.take()
    copy = sys.modules.get(mask.module(inherited.__name__)) if mask is not None else None
    if found is None and copy is not None:
        found = copy.take()
    return found


def main() -> None:
    become_subreaper()  # the target's setsid daemons come back here to be killed, not to init
    guard.install()
    request, channel = receive_request(AgentRequest[TargetConfig, PipelineReport])
    # The run's copy of the child side, which every child (and warm interpreter) of this agent runs.
    mask = Disguise.model_validate(request.disguise) if request.disguise is not None else None
    # A warm interpreter forked for this agent before its code ran (when the gate started the
    # agent as a fork of its `AgentHost`), else one started at the agent's first run. An agent
    # the gate meant to fork but that got none (the host's imports warned, or it died) runs its
    # runs fresh: an interpreter of its own would import the same way, only to be unusable.
    handed_down = _handed_down(mask)
    own_start = warm_start_enabled() and not request.agents_host
    tests = request.config.entrypoint is not None and request.config.entrypoint.test is not None
    preload = TEST_RUN_IMPORTS if tests else ()  # every run runs the observed test
    warm = WarmPool(Path(request.scratch), handed_down=handed_down, disguise=mask, preload=preload) if handed_down is not None or own_start else None
    try:
        factory = resolve_name(request.registry)
        # The installed stages: only this agent's own is imported (the others cost ~0.15 s).
        stage = load_stage(request.stage) if factory is build_registry else factory()[request.stage]
        ctx = StageContext(
            stage=request.stage,
            root=Path(request.root),
            config=request.config,
            device=request.device,
            deadline=request.deadline,
            scratch=Path(request.scratch),
            margin_s=request.margin_s,
            baseline=request.baseline,
            origin=Path(request.origin) if request.origin else None,
            baseline_entrypoint=EntrypointConfig.model_validate(request.baseline_entrypoint) if request.baseline_entrypoint else None,
            baseline_setup=dict(request.baseline_setup),
            warm=warm,
            disguise=mask,
            payload_models=parts(stage).payload_models,
            release_machine=lambda: channel.send(MACHINE_RELEASED, {}),
        )
        outcome = stage.run(ctx)
        reply = AgentReply[StageOutcome](outcome=outcome.model_copy(update={"files_read": combined(ctx.files_read), "training_stopped": ctx.training_stopped, "runs_left": ctx.runs_left}))
    except BaseException as exc:  # noqa: BLE001 - the parent turns this into stage-error
        reply = AgentReply[StageOutcome](error="".join(traceback.format_exception(type(exc), exc, exc.__traceback__))[-20000:])
    finally:
        if warm is not None:
            warm.close()
    channel.send(AGENT_REPLY, reply.model_dump(mode="json"))
    channel.close()
    sys.stdout.flush()
    sys.stderr.flush()
    # The reply is the stage's whole result: the interpreter's teardown (torch's, in an agent
    # forked from the agents' host: seconds on a busy machine) would only spend the stage's
    # margin, and an agent still tearing down at its budget is a stage that did not finish.
    guard.exit_after_reporting(0)


if __name__ == "__main__":
    main()
