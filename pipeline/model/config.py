"""The target's configuration (docs/contract.md, section 1): `[tool.traingate]` or `traingate.toml`.

Loading never imports target code: the entrypoint's module and function are resolved by
reading files, because the target's code may only run in child processes.
"""

from __future__ import annotations

import re
import shlex
from datetime import date
from pathlib import Path
from enum import Enum
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ModelWrapValidatorHandler, PrivateAttr, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, InitErrorDetails
from traingate.pipeline.model.schema import Category, Severity

# Unknown keys are errors, and so are `inf`/`nan` (TOML spells both): a budget or threshold
# that is not a finite number would silently switch a check off.
_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)

# Task ids and version labels name folders under the reports folder: one path segment only.
_SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
# A week: longer budgets are mistakes, and far larger ones overflow the process waits.
MAX_TIMEOUT_S = 7 * 24 * 3600.0


def check_safe_name(value: str) -> str:
    """`value` unchanged when it is one safe path segment; ValueError otherwise."""
    if not _SAFE_NAME.fullmatch(value) or value in (".", ".."):
        raise ValueError(
            f"{value!r} is not a valid name: use letters, digits, '.', '_' and '-' only, not starting with '.' or '-'"
        )
    return value


def safe_name_from(text: str) -> str:
    """A safe name made from a folder's name (for the default task id)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]", "_", text).lstrip(".-")
    return cleaned or "target"


class AmpArgs(BaseModel):
    """Command-line arguments that switch a script's mixed precision on or off."""

    model_config = _STRICT
    on: list[str] = Field(default_factory=list, description="appended to args for the AMP-on runs")
    off: list[str] = Field(default_factory=list, description="appended to args for the full-precision runs")


# Keys that only mean something for one shape of entrypoint (`setup` serves both).
_CALL_ONLY = ("kwargs", "amp_flag")
_SCRIPT_ONLY = ("args", "amp_args")


class EntrypointConfig(BaseModel):
    """The training code to smoke-call and profile: exactly one of `call` (a function, or a
    method `Class.method` on the instance `setup` returns) and `script` (a file run as
    `python script args...` would run it, after `setup` when one is given)."""

    model_config = _STRICT
    call: str | None = Field(default=None, description="module:function or module:Class.method, target root on sys.path")
    script: str | None = Field(default=None, description="a .py file under the target root, run as __main__")
    args: list[str] = Field(default_factory=list, description="the script's command-line arguments")
    amp_args: AmpArgs | None = Field(default=None, description="script arguments switching mixed precision on/off")
    setup: str | None = Field(
        default=None,
        description="module:function run first: for `call`, returning kwargs, the instance, or {'self': instance, **kwargs}; "
        "for `script`, preparing files or the environment (its return value is not used)",
    )
    kwargs: dict[str, Any] = Field(default_factory=dict, description="merged over setup's dict")
    # As a README runs it: `cd examples/mnist`, then `python main.py` (paths stay root-relative).
    workdir: str | None = Field(default=None, description="the folder the training runs in, relative to the target root (default: the root)")
    prepare: list[str] = Field(
        default_factory=list,
        description="scripts run first, each `path.py args...` (path relative to the target root), as __main__ in `workdir`: "
        "what a README runs before training (a data preparation)",
    )
    amp_flag: str | None = Field(default=None, description="keyword switching mixed precision on/off")
    seed: int = 0
    # The step budget: the training's own defaults, made short by the gate (a controlled stop).
    max_batches: int | None = Field(default=None, ge=1, description="every DataLoader iteration stops after this many batches")
    max_steps: int | None = Field(default=None, ge=1, description="the run stops after this many optimizer steps")
    # Set by the gate, never by the configuration (`load_config` refuses them): with no
    # entrypoint configured, the test whose training the later stages observe (a pytest node
    # id), and the baseline's files it runs with in its baseline form (path -> text, None: absent).
    test: str | None = Field(default=None, description="set by the gate: a pytest node id whose training is observed")
    test_files: dict[str, str | None] = Field(default_factory=dict, description="set by the gate: the baseline's test files")

    @field_validator("call")
    @classmethod
    def _module_colon_attribute(cls, value: str | None) -> str | None:
        if value is not None:
            module, sep, attr = value.partition(":")
            if not sep or not _dotted(module) or not _dotted(attr):
                raise ValueError(f"expected 'module:function' or 'module:Class.method', got {value!r}")
        return value

    @field_validator("setup")
    @classmethod
    def _module_colon_function(cls, value: str | None) -> str | None:
        if value is not None:
            module, sep, func = value.partition(":")
            if not sep or not _dotted(module) or not func.isidentifier():
                raise ValueError(f"expected 'module:function', got {value!r}")
        return value

    @field_validator("script")
    @classmethod
    def _relative_python_file(cls, value: str | None) -> str | None:
        if value is not None:
            parts = Path(value).parts
            if not value.endswith(".py") or Path(value).is_absolute() or ".." in parts or not parts:
                raise ValueError(f"expected a .py file relative to the target root, got {value!r}")
        return value

    @field_validator("workdir")
    @classmethod
    def _relative_folder(cls, value: str | None) -> str | None:
        if value is not None and (Path(value).is_absolute() or ".." in Path(value).parts):
            raise ValueError(f"expected a folder relative to the target root, got {value!r}")
        return value

    @field_validator("prepare")
    @classmethod
    def _prepare_scripts(cls, value: list[str]) -> list[str]:
        for command in value:
            words = prepare_words(command)
            if not words or not words[0].endswith(".py") or Path(words[0]).is_absolute() or ".." in Path(words[0]).parts:
                raise ValueError(f"expected `path.py args...` with a .py file relative to the target root, got {command!r}")
        return value

    @model_validator(mode="after")
    def _one_shape(self) -> EntrypointConfig:
        if self.test is not None and self.call is None and self.script is None:
            return self  # the gate's own shape: a test run under pytest, nothing else applies
        if (self.call is None) == (self.script is None):
            raise ValueError("give exactly one of `call` (module:function or module:Class.method) and `script` (a .py file)")
        # By value, not by the keys given: the stage agents re-validate a full dump of the config.
        wrong = [k for k in (_CALL_ONLY if self.script else _SCRIPT_ONLY) if getattr(self, k)]
        if wrong:
            shape, other = ("script", "call") if self.script else ("call", "script")
            raise ValueError(f"`{wrong[0]}` applies only to `{other}`, not to `{shape}`")
        return self

    @property
    def label(self) -> str:
        """What the reports name the entrypoint by."""
        if self.test is not None:
            return f"pytest {self.test}" + (" (its baseline form)" if self.test_files else "")
        if self.script is not None:
            return " ".join(["python", self.script, *self.args])
        return str(self.call)

    @property
    def amp_switch(self) -> str | None:
        """The configured way to switch mixed precision, None when AMP is not compared."""
        if self.script is not None:
            return "amp_args" if self.amp_args is not None else None
        return self.amp_flag

    def amp_setting(self, amp: bool) -> str:
        """The AMP setting of one call, as the reports show it (`use_amp=True`, `args + ['--amp']`)."""
        if self.script is not None:
            extra = (self.amp_args.on if amp else self.amp_args.off) if self.amp_args else []
            return f"amp_args.{'on' if amp else 'off'}: {' '.join(extra) or '(no arguments)'}"
        return f"{self.amp_flag}={amp}"

    def script_argv(self, amp: bool | None) -> list[str]:
        """The script's arguments for one call: `args`, then the AMP setting's `amp_args`."""
        extra = (self.amp_args.on if amp else self.amp_args.off) if self.amp_args and amp is not None else []
        return [*self.args, *extra]


SectionT = TypeVar("SectionT", bound=BaseModel)


def prepare_words(command: str) -> list[str]:
    """A `prepare` command line split as a shell would (no shell runs it); [] when it cannot be."""
    try:
        return shlex.split(command)
    except ValueError:
        return []


def _dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


class Stricter(str, Enum):
    """Which way a stage's value is stricter, marked on its field (`Annotated[float,
    Stricter.HIGHER]`). On a threshold (`Stage.policy_model`): the CI's floor (or the default)
    holds that way, and the target's own `[policy]` may only move it further
    (`traingate.pipeline.gate.policy_source`). On a field of a configuration section: a value
    moved the other way than the baseline's narrows what is verified (`config_diff`)."""

    HIGHER = "higher"  # a minimum (a speedup to reach); for a flag, True (it blocks)
    LOWER = "lower"  # a tolerance


def stricter_of(field: FieldInfo) -> Stricter | None:
    """The direction marked on a threshold's field, None when it has none."""
    return next((m for m in field.metadata if isinstance(m, Stricter)), None)


class PolicyConfig(BaseModel):
    """`[tool.traingate.policy]`: the gate's own keys below, and the thresholds of the registered
    stages (`Stage.policy_model`), at the same level, each validated by its stage's model."""

    # Extra keys are allowed only as the registered stages' thresholds (`_stage_thresholds`).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    block_on: list[Severity] = Field(default_factory=lambda: [Severity.CRITICAL, Severity.HIGH])
    # A test whose baseline form stops at an interface change (TypeError, ImportError, ...)
    # on this version: high (blocks) when true, medium otherwise (docs/edited-tests.md).
    interface_changes_block: bool = False
    # "new": with a --baseline, only findings whose id the baseline lacks block.
    block: Literal["all", "new"] = "all"
    # The target writes its own waivers, so the CI may switch them off.
    allow_waivers: bool = True
    # The CI may pin the suite (pytest arguments), so that a version cannot narrow its own
    # `tests`; only a CI policy file sets it (None: the target's `tests`).
    tests: list[str] | None = None
    # Against a --baseline, the baseline's gate configuration is the floor and a waiver the change
    # adds does not apply (docs/configuration.md). Only a CI policy file may accept either, for a
    # trusted pull request: the change under review would otherwise accept its own.
    allow_config_changes: bool = False
    allow_new_waivers: bool = False
    # Where `--baseline REVISION` keeps the base commits' reports (`--reports` chooses first);
    # only a CI policy file sets it: a change could otherwise point it at reports it wrote.
    reports: str | None = None

    @model_validator(mode="wrap")
    @classmethod
    def _stage_thresholds(cls, data: Any, handler: ModelWrapValidatorHandler[PolicyConfig]) -> PolicyConfig:
        """Each registered stage's thresholds validated by its model, and those not given at
        their defaults; the keys set (`model_fields_set`) stay those the data gave."""
        if not isinstance(data, dict):
            return handler(data)
        from traingate.pipeline.model.registry import policy_models  # the registry loads the stages, which import this module

        models = policy_models().values()
        owners = {key: model for model in models for key in model.model_fields}
        unknown = [key for key in data if key not in cls.model_fields and key not in owners]
        errors: list[InitErrorDetails] = [{"type": "extra_forbidden", "loc": (key,), "input": data[key]} for key in unknown]
        checked = dict(data)
        for model in models:
            try:
                valid = model.model_validate({key: value for key, value in data.items() if owners.get(key) is model})
            except ValidationError as exc:
                errors += [_under(None, error) for error in exc.errors()]
            else:
                checked.update(valid.model_dump())
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        policy = handler(checked)
        policy.__pydantic_fields_set__ &= set(data)
        return policy

    def thresholds(self, model: type[SectionT]) -> SectionT:
        """A stage's thresholds (its `policy_model`), as set here or by default."""
        return model.model_validate({key: value for key, value in (self.__pydantic_extra__ or {}).items() if key in model.model_fields})

    @field_validator("tests")
    @classmethod
    def _pinned_suite_not_empty(cls, value: list[str] | None) -> list[str] | None:
        if value == []:
            raise ValueError("an empty list runs no suite; give the pytest arguments, for example [\"tests\"]")
        return value


# Integrity failures of the gate itself: no waiver and no baseline can accept them.
NEVER_WAIVABLE = frozenset({Category.TARGET_MODIFIED, Category.STAGE_ERROR, Category.HANG, Category.LEFTOVER_PROCESS, Category.ENVIRONMENT, Category.BASELINE_UNAVAILABLE, Category.UNWATCHED_DIVERGENCE, Category.BUDGET_OVERRUN})


class WaiverConfig(BaseModel):
    """One `[[tool.traingate.waive]]` entry: a finding id, or a category at a path (and line or function)."""

    model_config = _STRICT
    id: str | None = None
    category: Category | None = None
    path: str | None = None
    line: int | None = Field(default=None, ge=1)
    function: str | None = None
    reason: str
    expires: date | None = None

    @field_validator("category", mode="before")
    @classmethod
    def _known_category(cls, value: Any) -> Any:
        from traingate.pipeline.model.registry import rule_table  # the registry loads the stages, which import this module

        if isinstance(value, str) and value not in {c.value for c in rule_table().categories()}:
            raise ValueError(f"unknown category {value!r} (`traingate explain` lists them)")
        return value

    @field_validator("reason")
    @classmethod
    def _says_why(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("a waiver needs a reason: say why the finding is accepted")
        return value.strip()

    @model_validator(mode="after")
    def _one_way_to_match(self) -> WaiverConfig:
        by_place = self.category is not None or self.path is not None or self.line is not None or self.function is not None
        if self.id is not None and by_place:
            raise ValueError("give either `id` or `category` + `path` (with `line` or `function`), not both")
        if self.id is None and (self.category is None or self.path is None):
            raise ValueError("a waiver needs `id` (a finding id), or `category` and `path`")
        if self.category in NEVER_WAIVABLE:
            raise ValueError(f"{self.category.value if self.category else ''} findings cannot be waived")
        return self


MAX_OBSERVED_TESTS = 10


class TargetConfig(BaseModel):
    """The target's configuration: the gate's own keys below, and one section for each
    registered stage that has one (`Stage.config_model`, under the stage's name), validated by
    that stage's model. Any other key is an error, as in every table of the configuration."""

    # Extra keys are allowed only as the registered stages' sections (`_stage_sections`).
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)
    task: str | None = None
    # pytest arguments; `false` declares that the repo has no test suite (pytest is not run);
    # unset: what pytest itself collects from the repo's root (its `testpaths`, `python_files`,
    # or its discovery from the root, `tests/` included), not a fixed folder.
    tests: list[str] | Literal[False] | None = None
    timeout_s: float = Field(default=600, gt=0, le=MAX_TIMEOUT_S)
    entrypoint: EntrypointConfig | None = None
    # With no entrypoint configured: the most tests whose training the stages observe (each at
    # optimizer-step sites no test picked before it reached), one after another in each stage.
    observe_tests: int = Field(default=3, ge=1, le=MAX_OBSERVED_TESTS)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    # Written by `traingate init` where its check run did not verify the file: why. The run repeats it.
    unverified: str | None = None
    waive: list[WaiverConfig] = Field(default_factory=list)
    # Filled by load_config, never from TOML: the configuration file and the inline
    # `# traingate: ignore[...]` comments found in the target's sources.
    _file: str | None = PrivateAttr(default=None)
    _inline_waivers: list[Any] = PrivateAttr(default_factory=list)

    @property
    def config_file(self) -> str | None:
        return self._file

    @property
    def inline_waivers(self) -> list[Any]:
        """`traingate.pipeline.gate.waivers.InlineWaiver`s, in file and line order."""
        return self._inline_waivers

    @field_validator("tests")
    @classmethod
    def _tests_not_empty(cls, value: list[str] | Literal[False] | None) -> list[str] | Literal[False] | None:
        # An empty list would run pytest on the current folder's defaults, or on nothing: ambiguous.
        if value == []:
            raise ValueError("an empty list runs no suite; give the pytest arguments (leave `tests` out for what pytest collects itself), or `tests = false` to declare that the repo has no test suite")
        return value

    @model_validator(mode="after")
    def _sections_fit_the_budget(self) -> TargetConfig:
        for value in (self.__pydantic_extra__ or {}).values():
            problem = value.over_budget(self.timeout_s) if isinstance(value, BudgetedSection) else None
            if problem:
                raise ValueError(problem)
        return self

    @property
    def has_test_suite(self) -> bool:
        return self.tests is not False

    def tests_described(self) -> str:
        """The suite as the reports name it: the configured arguments, or pytest's own discovery."""
        if self.tests is None:
            return "what pytest collects from the repo's root by its own rules (its `testpaths` where set)"
        return f"`tests = {self.tests}`" if self.tests is not False else "no suite (`tests = false`)"

    @model_validator(mode="before")
    @classmethod
    def _stage_sections(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        from traingate.pipeline.model.registry import config_sections, extra_sections  # the registry loads the stages, which import this module

        sections = config_sections()
        known = {**sections, **extra_sections()}  # the sections a stage declares under keys of their own are optional
        checked = dict(data)
        errors: list[InitErrorDetails] = []
        for key, value in data.items():
            if key in cls.model_fields:
                continue
            model = known.get(key)
            if model is None:
                errors.append({"type": "extra_forbidden", "loc": (key,), "input": value})
            elif not isinstance(value, model):
                try:
                    checked[key] = model.model_validate(value)
                except ValidationError as exc:
                    errors += [_under(key, error) for error in exc.errors()]
        if errors:
            raise ValidationError.from_exception_data(cls.__name__, errors)
        return {**{key: model() for key, model in sections.items()}, **checked}

    def section(self, name: str, model: type[SectionT]) -> SectionT:
        """The stage `name`'s section, as its model (defaults where the target's file has none)."""
        return self.optional_section(name, model) or model()

    def optional_section(self, key: str, model: type[SectionT]) -> SectionT | None:
        """A section a stage declares under a key of its own (`Stage.extra_sections`), as its
        model; None where the target's file has none."""
        value = (self.__pydantic_extra__ or {}).get(key)
        if value is not None and not isinstance(value, model):
            raise TypeError(f"the {key!r} section is a {type(value).__name__}, not a {model.__name__}")
        return value

    @field_validator("task")
    @classmethod
    def _task_is_one_path_segment(cls, value: str | None) -> str | None:
        return None if value is None else check_safe_name(value)


@runtime_checkable
class BudgetedSection(Protocol):
    """A section whose own budget must fit within the stage's (`timeout_s`)."""

    def over_budget(self, timeout_s: float) -> str | None:
        """Why it does not fit within `timeout_s`; None when it does."""


def _under(key: str | None, error: ErrorDetails) -> InitErrorDetails:
    loc = error["loc"] if key is None else (key, *error["loc"])
    details: InitErrorDetails = {"type": error["type"], "loc": loc, "input": error["input"]}
    if "ctx" in error:
        details["ctx"] = error["ctx"]
    return details
