"""Locations from what the correctness instruments hand back: site indexes into each
instrument's own table of the target's lines."""

from __future__ import annotations

from typing import Any

from traingate.pipeline.schema import Location


def site(data: dict[str, Any], index: int | None) -> dict[str, Any] | None:
    sites = data.get("sites", [])
    return sites[index] if isinstance(index, int) and 0 <= index < len(sites) else None


def location(data: dict[str, Any], index: int | None, fallback: Location) -> Location:
    found = site(data, index)
    if found is None:
        return fallback
    return Location(path=found["path"], line=found["line"], function=found.get("function"))


def code(data: dict[str, Any], index: int | None) -> str:
    found = site(data, index)
    return str(found.get("code", "")) if found else ""


def main_step_site(steps: dict[str, Any]) -> int | None:
    """The line of the target that made the most optimizer steps."""
    sites = steps.get("step_sites", [])
    return max(sites, key=lambda s: s["steps"])["site"] if sites else None
