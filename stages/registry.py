"""The stages traingate knows, in the order they run."""

from __future__ import annotations

from stages.base import Stage


def build_registry() -> dict[str, Stage]:
    # Imported here, not at module import: the registry is built in main(), not as a global.
    from stages.concurrency import ConcurrencyStage
    from stages.execution import ExecutionStage
    from stages.performance import PerformanceStage

    return {
        "execution": ExecutionStage(),
        "performance": PerformanceStage(),
        "concurrency": ConcurrencyStage(),
    }


STAGE_NAMES = ("execution", "performance", "concurrency")
