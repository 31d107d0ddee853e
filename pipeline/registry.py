"""The stages the gate knows: the classes registered in the `traingate.stages` entry-point group.

pyproject.toml is the one place that lists them; each class carries its `order` (where it runs
in the pipeline) and the categories it may emit. A team can add a stage of its own by
registering a class in the same group from its own installed package.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any, Protocol, cast

from traingate.pipeline.schema import Category, StageOutcome

ENTRY_POINT_GROUP = "traingate.stages"


class Stage(Protocol):
    """A stage: its name, its place in the order, the categories it may emit, and `run`.

    `run` receives a `traingate.stages.base.StageContext` inside the stage's agent process.
    """

    name: str
    order: int
    categories: frozenset[Category]

    def run(self, ctx: Any) -> StageOutcome: ...


class RegistryError(RuntimeError):
    """A registered stage does not load or does not match its entry point."""


def build_registry() -> dict[str, Stage]:
    """Every registered stage, keyed by name, in the order they run."""
    stages = [_load(ep) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    if not stages:
        raise RegistryError(f"no stage is registered in the {ENTRY_POINT_GROUP!r} entry-point group: is traingate installed?")
    return {s.name: s for s in sorted(stages, key=lambda s: (s.order, s.name))}


def load_stage(name: str) -> Stage:
    """The one registered stage called `name` (a stage agent imports its own stage only)."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        raise RegistryError(f"no stage named {name!r} is registered in the {ENTRY_POINT_GROUP!r} entry-point group")
    return _load(next(iter(found)))


def _load(ep: EntryPoint) -> Stage:
    try:
        stage = ep.load()()
    except Exception as exc:  # re-raised with the stage named: the gate cannot run without it
        raise RegistryError(f"stage {ep.name!r} ({ep.value}) does not load: {exc}") from exc
    if getattr(stage, "name", None) != ep.name:
        raise RegistryError(f"stage entry point {ep.name!r} loads a stage named {getattr(stage, 'name', None)!r}")
    return cast(Stage, stage)


def stage_names() -> tuple[str, ...]:
    return tuple(build_registry())
