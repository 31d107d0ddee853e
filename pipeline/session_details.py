"""The envelope of the details of a stage that runs as a session of child runs (concurrency,
correctness; `traingate.stages.session`): where it ran, its budget, its runs, its checks and
why it stopped early. Each stage gives its own run and checks records."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from traingate.pipeline.execution_details import Detail

RunT = TypeVar("RunT")
ChecksT = TypeVar("ChecksT")


class SessionDetails(Detail, Generic[RunT, ChecksT]):
    device: str | None = None
    budget_s: float | None = None  # the stage's budget (timeout_s)
    runs: list[RunT] = []
    checks: ChecksT | None = None
    stopped: str | None = None  # why the stage stopped early

    def as_json(self) -> dict[str, Any]:
        """As report.json keeps them: JSON types, no field that was never set, and a probe's
        record by its wire names (an optimizer's class under `class`), as the probe sent it."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)
