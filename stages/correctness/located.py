"""Locations from what the correctness instruments hand back: site indexes into each
instrument's own table of the target's lines."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import BaseModel

from traingate.pipeline.model.schema import Location
from traingate.stages.base import location_of
from traingate.stages.contract.payloads.base import Site
from traingate.stages.correctness.probe.payloads import StepsPayload


class Sited(Protocol):
    """A payload with its own table of the target's lines."""

    @property
    def sites(self) -> list[Site]: ...


def site(data: Sited | None, index: int | None) -> Site | None:
    sites = data.sites if data is not None else []
    return sites[index] if isinstance(index, int) and 0 <= index < len(sites) else None


def location(data: Sited | None, index: int | None, fallback: Location) -> Location:
    return location_of(site(data, index)) or fallback


def code(data: Sited | None, index: int | None) -> str:
    found = site(data, index)
    return found.code if found else ""


def main_step_site(steps: StepsPayload | None) -> int | None:
    """The line of the target that made the most optimizer steps."""
    sites = steps.step_sites if steps is not None else []
    return max(sites, key=lambda s: s.steps).site if sites else None


def record(model: BaseModel) -> dict[str, Any]:
    """A payload record as the evidence gives it: JSON types, the probe's key names."""
    return model.model_dump(mode="json", by_alias=True)
