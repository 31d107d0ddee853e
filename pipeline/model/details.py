"""What every stage's `details` model builds on.

A stage's details are what its report page shows (`stages/<name>/details.py`, read by its
template `stages/<name>/report.md.j2`). The stage hands them back as `model_dump(mode="json")`
inside its StageOutcome, so report.json keeps plain JSON; the renderer validates them again
with the model the stage registers (`Stage.details_model`) and the template reads the model.
Every part is optional: a report built without a stage's details renders without them.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict


class Detail(BaseModel):
    # Built at first use, not at import: a gate run imports every stage's details models and
    # reads those of the stages it ran (a third of a gate process's start-up otherwise).
    model_config = ConfigDict(extra="forbid", defer_build=True)


RunT = TypeVar("RunT")
ChecksT = TypeVar("ChecksT")


class SessionDetails(Detail, Generic[RunT, ChecksT]):
    """The envelope of the details of a stage that runs as a session of child runs
    (`traingate.stages.agent.session`): where it ran, its budget, its runs, its checks and why it
    stopped early. Each stage gives its own run and checks records."""

    device: str | None = None
    budget_s: float | None = None  # the stage's budget (timeout_s)
    runs: list[RunT] = []
    checks: ChecksT | None = None
    stopped: str | None = None  # why the stage stopped early

    def as_json(self) -> dict[str, Any]:
        """As report.json keeps them: JSON types, no field that was never set, and a probe's
        record by its wire names (an optimizer's class under `class`), as the probe sent it."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)
