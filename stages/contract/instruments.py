"""The instruments a stage can ask the entrypoint harness to install, by name.

Each is a `module:factory` the harness resolves inside the target's process; the factory
gives an object with `install(ctx)` and `collect() -> dict`. The harness hands back each
`collect()` result under its spec, or `{"error": traceback}` when it failed.
"""

from __future__ import annotations

from typing import Any

PERFORMANCE_FULL = "traingate.stages.performance.probe.instrument:full"
PERFORMANCE_LIGHT = "traingate.stages.performance.probe.instrument:light"

CONCURRENCY_TRACE = "traingate.stages.concurrency.probe.trace:ProtocolTrace"
CONCURRENCY_LOSSES = "traingate.stages.concurrency.probe.trace:LossTrace"
CONCURRENCY_RNG = "traingate.stages.concurrency.probe.rng:RngSites"
CONCURRENCY_LOADERS = "traingate.stages.concurrency.probe.loaders:LoaderWatch"
CONCURRENCY_NONBLOCKING = "traingate.stages.concurrency.probe.cuda:NonBlockingWatch"
CONCURRENCY_STREAMS = "traingate.stages.concurrency.probe.cuda:StreamSanitizer"

CORRECTNESS_STEPS = "traingate.stages.correctness.probe.steps:StepWatch"
CORRECTNESS_LOSSES = "traingate.stages.correctness.probe.losses:LossWatch"
CORRECTNESS_LOADERS = "traingate.stages.correctness.probe.loaders:LoaderWatch"
CORRECTNESS_FIRST_UPDATE = "traingate.stages.correctness.probe.update:FirstUpdate"
CORRECTNESS_ONE_BATCH = "traingate.stages.correctness.probe.overfit:OneBatch"
CORRECTNESS_RANKS = "traingate.stages.correctness.probe.ranks:RankWatch"
CORRECTNESS_GRADIENTS = "traingate.stages.correctness.probe.gradients:StaleGradientWatch"
CORRECTNESS_MODES = "traingate.stages.correctness.probe.modes:ModeWatch"
CORRECTNESS_LOSS_INPUTS = "traingate.stages.correctness.probe.loss_inputs:LossInputWatch"
CORRECTNESS_MIXING = "traingate.stages.correctness.probe.mixing:BatchMixingWatch"
CORRECTNESS_FACTS = "traingate.stages.correctness.probe.facts:FactsWatch"

ALL = frozenset(
    {
        PERFORMANCE_FULL,
        PERFORMANCE_LIGHT,
        CONCURRENCY_TRACE,
        CONCURRENCY_LOSSES,
        CONCURRENCY_RNG,
        CONCURRENCY_LOADERS,
        CONCURRENCY_NONBLOCKING,
        CONCURRENCY_STREAMS,
        CORRECTNESS_STEPS,
        CORRECTNESS_LOSSES,
        CORRECTNESS_LOADERS,
        CORRECTNESS_FIRST_UPDATE,
        CORRECTNESS_ONE_BATCH,
        CORRECTNESS_RANKS,
        CORRECTNESS_GRADIENTS,
        CORRECTNESS_MODES,
        CORRECTNESS_LOSS_INPUTS,
        CORRECTNESS_MIXING,
        CORRECTNESS_FACTS,
    }
)
# What an instrument hands back when its collect() raised.
ERROR_KEY = "error"


def collect_error(payload: dict[str, Any]) -> str | None:
    """The traceback a failed collect() handed back: the payload is then that alone (every
    built-in payload is checked to be either that or its model); None for a payload."""
    error = payload[ERROR_KEY] if set(payload) == {ERROR_KEY} else None
    return error if isinstance(error, str) else None
