"""The stages the gate knows: the classes registered in the `traingate.stages` entry-point group.

pyproject.toml is the one place that lists them. Everything that makes a stage comes from its
class (`traingate.stages.api.Stage`, declaring `StageDeclaration`'s attributes): its place in
the order, its rules (and so its categories), its configuration sections, its thresholds under
the policy, the model of its details and the template of its page, the models of its
instruments' payloads, the metrics of its history. The gate assembles the rule table, the
configuration, the policy and its CI floor, the history table and the report pages from the
registered stages at start-up and names none of them; a team adds a stage of its own by
registering a class in the same group from its own installed package (docs/architecture.md).
"""

from __future__ import annotations

import difflib
from dataclasses import replace
import functools
from collections.abc import Iterable, Mapping
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import MappingProxyType
from typing import Any, Protocol, cast

from pydantic import BaseModel

from traingate.pipeline.model.config import PolicyConfig, stricter_of
from traingate.pipeline.model.history import HistoryMetric
from traingate.pipeline.model.rules import GATE_RULES, VERIFICATION_RULES, Rule, RuleTable
from traingate.pipeline.model.schema import Category, StageOutcome

ENTRY_POINT_GROUP = "traingate.stages"
# Keys of the configuration that are the gate's own: no stage may take one as its name.
GATE_KEYS = frozenset({"task", "tests", "timeout_s", "entrypoint", "policy", "waive"})


class StageDeclaration:
    """Everything a stage may declare besides `name`, `order` and `run`, with its default: the
    one list of a stage's attributes (`traingate.stages.api.Stage` builds on it; a stage that
    declares any other public attribute does not load).

    - `rules`: its rules, each category it emits with one; its categories are theirs.
    - `config_model`: its `[tool.traingate.<name>]` section; `extra_sections`: sections of
      its own under another key (absent from a configuration: None).
    - `policy_model`: its thresholds, keys of `[tool.traingate.policy]`, each a field marked
      with the direction in which a value is stricter (`Stricter`): the CI's floor applies that way.
    - `details_model`, `template`: what its page reads from `details`, and the Jinja2 file of
      its page (else the generic one); `payload_models`: instrument spec -> the model of what it
      hands back.
    - `history_metrics`: the metrics of its own `traingate history` shows, a column each.
    - `needs_training`: True: a run where the training function cannot be called skips the
      stage; False: it runs whatever happened before. `purpose`: what it does with the function,
      a verb for the reason it was skipped ("profile": "nothing to profile").
    - `times_runs`: its runs are timed: it leads its group, and the group's other stages
      start once it releases the machine (`StageContext.machine_released`) or ends.
    - `checks_steps`: it reports the optimizer steps it observed as the `steps.observed` metric,
      so `traingate init` can run it alone to check a proposed configuration.
    - `agent_modules`: the modules its `run` imports (its work, kept out of the gate's
      process), which an import server imports once for every agent it serves instead of each
      agent on its own.
    """

    rules: tuple[Rule, ...] = ()
    config_model: type[BaseModel] | None = None
    extra_sections: Mapping[str, type[BaseModel]] = MappingProxyType({})
    policy_model: type[BaseModel] | None = None
    details_model: type[BaseModel] | None = None
    template: Path | None = None
    payload_models: Mapping[str, type[BaseModel]] = MappingProxyType({})
    history_metrics: tuple[HistoryMetric, ...] = ()
    needs_training: bool = True
    purpose: str = "observe"
    times_runs: bool = False
    checks_steps: bool = False
    agent_modules: tuple[str, ...] = ()


_DECLARED = tuple(a for a in vars(StageDeclaration) if not a.startswith("_"))
# Every public attribute a stage class may declare: anything else is a misspelling that would
# otherwise be read as "not declared" and silently ignored (as pytest rejects unknown hooks).
STAGE_ATTRIBUTES = frozenset({"name", "order", "run", *_DECLARED})


class Stage(Protocol):
    """A stage as the gate sees it: its name, its place in the order, and `run`, which receives
    a `traingate.stages.api.StageContext` inside the stage's agent process (the gate never
    calls it). Its other attributes are `StageDeclaration`'s, read through `parts`."""

    name: str
    order: int

    def run(self, ctx: Any) -> StageOutcome: ...


class StageParts(StageDeclaration):
    """A stage's declarations, with the defaults of what it does not declare, and its categories."""

    def __init__(self, stage: Stage) -> None:
        for attribute in _DECLARED:
            setattr(self, attribute, getattr(stage, attribute, getattr(StageDeclaration, attribute)))
        self.rules = tuple(self.rules)
        self.template = Path(self.template) if self.template is not None else None
        self.categories: frozenset[Category] = frozenset(rule.category for rule in self.rules)


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
    _check_apart(stages)
    return {s.name: s for s in sorted(stages, key=lambda s: (s.order, s.name))}


def build_deferred_models() -> None:
    """Build now every model of the gate's loaded modules that defers its validator to its
    first use (`defer_build`: payloads, details). For a process that many others fork from (an
    import server, a gate server): each fork would otherwise build the ones it uses, the same
    work in each. A model that cannot be built yet is left to build on first use."""
    pending: list[type[BaseModel]] = [BaseModel]
    seen: set[type[BaseModel]] = set()
    while pending:
        for model in pending.pop().__subclasses__():
            if model in seen:
                continue
            seen.add(model)
            pending.append(model)
            if model.__module__.startswith("traingate.") and not model.__pydantic_complete__:
                model.model_rebuild(raise_errors=False)


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


def extra_sections() -> dict[str, type[BaseModel]]:
    """The sections registered stages declare under keys of their own (`extra_sections`)."""
    return {key: model for stage in build_registry().values() for key, model in parts(stage).extra_sections.items()}


def policy_models() -> dict[str, type[BaseModel]]:
    """Each registered stage's thresholds (`policy_model`), by the stage's name, in stage order."""
    return {name: model for name, stage in build_registry().items() if (model := parts(stage).policy_model) is not None}


def history_metrics() -> tuple[HistoryMetric, ...]:
    """The metrics `traingate history` shows, the registered stages' in stage order."""
    return tuple(replace(metric, stage=name) for name, stage in build_registry().items() for metric in parts(stage).history_metrics)


def step_checking_stage() -> str:
    """The first registered stage that reports the optimizer steps it observed (`checks_steps`)."""
    found = [name for name, stage in build_registry().items() if parts(stage).checks_steps]
    if not found:
        raise RegistryError("no registered stage reports the optimizer steps it observed (`checks_steps`)")
    return found[0]


def stages_observing_tests() -> list[str]:
    """The stages a run with no entrypoint needs to observe the tests' training and count its
    steps: those that run without the training (one of them names the tests), then the
    step-checking stage."""
    ahead = [name for name, stage in build_registry().items() if not parts(stage).needs_training]
    return [*ahead, step_checking_stage()]


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
    found = parts(stage)
    foreign = sorted(rule.id for rule in found.rules if rule.stage != ep.name)
    if foreign:
        raise RegistryError(f"stage {ep.name!r} ({ep.value}) declares rules of another stage: {', '.join(foreign)}")
    taken = sorted(GATE_KEYS & set(found.extra_sections))
    if taken:
        raise RegistryError(f"stage {ep.name!r} ({ep.value}) declares a section under a key of the gate's configuration: {', '.join(taken)}")
    _check_thresholds(ep, found)
    return stage


def _check_thresholds(ep: EntryPoint, found: StageParts) -> None:
    """Each threshold is a key the gate's policy does not have, marked with the direction in
    which it is stricter (the CI's floor applies that way)."""
    fields = found.policy_model.model_fields if found.policy_model is not None else {}
    for key, field in fields.items():
        if key in PolicyConfig.model_fields:
            raise RegistryError(f"stage {ep.name!r} ({ep.value}) declares a threshold {key!r} that is a key of the gate's policy")
        if stricter_of(field) is None:
            raise RegistryError(f"stage {ep.name!r} ({ep.value}) declares a threshold {key!r} without the direction it is stricter in (Annotated[..., Stricter.HIGHER] or Stricter.LOWER)")


def _check_apart(stages: list[Stage]) -> None:
    """No two stages declare one threshold or one configuration key."""
    owners: dict[str, str] = {}
    for stage in stages:
        found = parts(stage)
        keys = [*(found.policy_model.model_fields if found.policy_model is not None else ()), *found.extra_sections]
        for key in (stage.name, *keys):
            if key in owners:
                raise RegistryError(f"stages {owners[key]!r} and {stage.name!r} both declare {key!r}")
            owners[key] = stage.name


def _check_attributes(ep: EntryPoint, stage: Stage) -> None:
    """Reject a public attribute the stage interface does not know, naming the closest one."""
    unknown = sorted(a for a in dir(type(stage)) if not a.startswith("_") and a not in STAGE_ATTRIBUTES)
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, sorted(STAGE_ATTRIBUTES), n=1)
        if name == "categories":
            hint = " (a stage's categories are those of its `rules`)"
        else:
            hint = f" (did you mean {close[0]!r}?)" if close else f" (a stage declares only: {', '.join(sorted(STAGE_ATTRIBUTES))})"
        raise RegistryError(f"stage {ep.name!r} ({ep.value}) declares an unknown attribute {name!r}{hint}")
