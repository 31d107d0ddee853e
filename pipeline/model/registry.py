"""The stages the gate knows: the classes registered in the `traingate.stages` entry-point group.

pyproject.toml is the one place that lists them. Everything that makes a stage comes from its
class (`Stage`): its place in the order, its rules (and so its categories), its configuration
section, the model of its details and the template of its page, the models of its
instruments' payloads. The gate assembles the rule table, the configuration and the report
pages from the registered stages at start-up and names none of them; a team adds a stage of
its own by registering a class in the same group from its own installed package
(docs/architecture.md).
"""

from __future__ import annotations

import difflib
import functools
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Protocol, cast

from pydantic import BaseModel

from traingate.pipeline.model.rules import ANY_STAGE_CATEGORIES, GATE_RULES, VERIFICATION_RULES, Rule, RuleTable
from traingate.pipeline.model.schema import Category, StageOutcome

ENTRY_POINT_GROUP = "traingate.stages"
# Keys of the configuration that are the gate's own: no stage may take one as its name.
GATE_KEYS = frozenset({"task", "tests", "timeout_s", "entrypoint", "policy", "distributed", "waive"})
# Every public attribute a stage class may declare: anything else is a misspelling that would
# otherwise be read as "not declared" and silently ignored (as pytest rejects unknown hooks).
STAGE_ATTRIBUTES = frozenset(
    {"name", "order", "categories", "run", "rules", "config_model", "details_model", "template", "payload_models", "purpose", "times_runs", "checks_steps"}
)


class Stage(Protocol):
    """A stage: its name, its place in the order, the categories it may emit, and `run`.

    `run` receives a `traingate.stages.base.StageContext` inside the stage's agent process.
    Optional attributes (read through `parts`): `rules` (its rules: each category it emits
    needs one), `config_model` (its `[tool.traingate.<name>]` section), `details_model` (what
    its page reads from `details`), `template` (a Jinja2 file for its page; else the generic
    one), `payload_models` (instrument spec -> the model of what it hands back) and `purpose`
    (what it does with the training function, such as "profile" or "observe": a run where the
    function cannot be called skips the stage; None: the stage runs whatever happened before)
    and `times_runs` (True: its runs are timed, so no other stage runs beside it; default False),
    `checks_steps` (True: it reports the optimizer steps it observed as the `steps.observed`
    metric, so `traingate init` can run it alone to check a proposed configuration).
    """

    name: str
    order: int
    categories: frozenset[Category]

    def run(self, ctx: Any) -> StageOutcome: ...


class StageParts:
    """A stage's optional attributes, with their defaults."""

    def __init__(self, stage: Stage) -> None:
        self.rules: tuple[Rule, ...] = tuple(getattr(stage, "rules", ()))
        self.config_model: type[BaseModel] | None = getattr(stage, "config_model", None)
        self.details_model: type[BaseModel] | None = getattr(stage, "details_model", None)
        template = getattr(stage, "template", None)
        self.template: Path | None = Path(template) if template is not None else None
        self.payload_models: Mapping[str, type[BaseModel]] = getattr(stage, "payload_models", None) or {}
        self.purpose: str | None = getattr(stage, "purpose", "observe")
        self.times_runs: bool = bool(getattr(stage, "times_runs", False))
        self.checks_steps: bool = bool(getattr(stage, "checks_steps", False))


def parts(stage: Stage) -> StageParts:
    return StageParts(stage)


class RegistryError(RuntimeError):
    """A registered stage does not load or does not match its entry point."""


@functools.cache
def build_registry() -> dict[str, Stage]:
    """Every registered stage, keyed by name, in the order they run (loaded once a process)."""
    stages = [_load(ep) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    if not stages:
        raise RegistryError(f"no stage is registered in the {ENTRY_POINT_GROUP!r} entry-point group: is traingate installed?")
    rule_table_of(stages)  # two stages claiming one rule id: the gate cannot start
    return {s.name: s for s in sorted(stages, key=lambda s: (s.order, s.name))}


def load_stage(name: str) -> Stage:
    """The one registered stage called `name` (a stage agent imports its own stage only)."""
    found = entry_points(group=ENTRY_POINT_GROUP, name=name)
    if not found:
        raise RegistryError(f"no stage named {name!r} is registered in the {ENTRY_POINT_GROUP!r} entry-point group")
    return _load(next(iter(found)))


def rule_table_of(stages: Iterable[Stage]) -> RuleTable:
    """The gate's rules and those of `stages`."""
    try:
        # The stages' rules in the stages' order, then the gate's (the order `explain` and SARIF list them).
        return RuleTable([*(rule for stage in sorted(stages, key=lambda s: (s.order, s.name)) for rule in parts(stage).rules), *GATE_RULES, *VERIFICATION_RULES])
    except ValueError as exc:
        raise RegistryError(f"the registered stages' rules do not make one table: {exc}") from exc


@functools.cache
def rule_table() -> RuleTable:
    """The gate's rules and every registered stage's."""
    return rule_table_of(build_registry().values())


def rule_for(category: Category) -> Rule:
    """The category's own rule, from the whole table."""
    return rule_table().for_category(category)


def config_sections() -> dict[str, type[BaseModel]]:
    """Each registered stage's configuration section, by the stage's name (its TOML key)."""
    return {name: model for name, stage in build_registry().items() if (model := parts(stage).config_model) is not None}


def step_checking_stage() -> str:
    """The first registered stage that reports the optimizer steps it observed (`checks_steps`)."""
    found = [name for name, stage in build_registry().items() if parts(stage).checks_steps]
    if not found:
        raise RegistryError("no registered stage reports the optimizer steps it observed (`checks_steps`)")
    return found[0]


def stage_names() -> tuple[str, ...]:
    return tuple(build_registry())


def _load(ep: EntryPoint) -> Stage:
    try:
        stage = cast(Stage, ep.load()())
    except Exception as exc:  # re-raised with the stage named: the gate cannot run without it
        raise RegistryError(f"stage {ep.name!r} ({ep.value}) does not load: {exc}") from exc
    if getattr(stage, "name", None) != ep.name:
        raise RegistryError(f"stage entry point {ep.name!r} loads a stage named {getattr(stage, 'name', None)!r}")
    if ep.name in GATE_KEYS:
        raise RegistryError(f"stage {ep.name!r} takes the name of a key of the gate's configuration")
    _check_attributes(ep, stage)
    ruled = {rule.category for rule in parts(stage).rules} | ANY_STAGE_CATEGORIES
    unruled = sorted(c.value for c in set(stage.categories) - ruled)
    if unruled:
        raise RegistryError(f"stage {ep.name!r} emits categories it has no rule for: {', '.join(unruled)}")
    return stage


def _check_attributes(ep: EntryPoint, stage: Stage) -> None:
    """Reject a public attribute the stage interface does not know, naming the closest one."""
    unknown = sorted(a for a in dir(type(stage)) if not a.startswith("_") and a not in STAGE_ATTRIBUTES)
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, sorted(STAGE_ATTRIBUTES), n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else f" (a stage declares only: {', '.join(sorted(STAGE_ATTRIBUTES))})"
        raise RegistryError(f"stage {ep.name!r} ({ep.value}) declares an unknown attribute {name!r}{hint}")
