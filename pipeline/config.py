"""The target's configuration (docs/contract.md, section 1): `[tool.traingate]` or `traingate.toml`.

Loading never imports target code: the entrypoint's module and function are resolved by
reading files, because the target's code may only run in child processes.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from traingate.pipeline.schema import Severity

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

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


# Keys that only mean something for one shape of entrypoint.
_CALL_ONLY = ("setup", "kwargs", "amp_flag")
_SCRIPT_ONLY = ("args", "amp_args")


class EntrypointConfig(BaseModel):
    """The training code to smoke-call and profile: exactly one of `call` (a function, or a
    method `Class.method` on the instance `setup` returns) and `script` (a file run as
    `python script args...` would run it)."""

    model_config = _STRICT
    call: str | None = Field(default=None, description="module:function or module:Class.method, target root on sys.path")
    script: str | None = Field(default=None, description="a .py file under the target root, run as __main__")
    args: list[str] = Field(default_factory=list, description="the script's command-line arguments")
    amp_args: AmpArgs | None = Field(default=None, description="script arguments switching mixed precision on/off")
    setup: str | None = Field(default=None, description="module:function returning kwargs, the instance, or {'self': instance, **kwargs}")
    kwargs: dict[str, Any] = Field(default_factory=dict, description="merged over setup's dict")
    amp_flag: str | None = Field(default=None, description="keyword switching mixed precision on/off")
    seed: int = 0

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

    @model_validator(mode="after")
    def _one_shape(self) -> EntrypointConfig:
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


def _dotted(text: str) -> bool:
    return bool(text) and all(part.isidentifier() for part in text.split("."))


class PolicyConfig(BaseModel):
    model_config = _STRICT
    amp_speedup_min: float = 1.5
    amp_memory_reduction_min: float = 0.40
    amp_accuracy_tolerance: float = 0.01
    block_on: list[Severity] = Field(default_factory=lambda: [Severity.CRITICAL, Severity.HIGH])


class PerformanceConfig(BaseModel):
    """`[tool.traingate.performance]`: how long the profiled runs are."""

    model_config = _STRICT
    warmup_steps: int = Field(default=3, ge=0)
    min_steps: int = Field(default=8, ge=1, description="fewer profiled steps than this: not measured")
    timing_runs: int = Field(default=1, ge=1, description="uninstrumented runs per AMP setting")


class ConcurrencyConfig(BaseModel):
    """`[tool.traingate.concurrency]`."""

    model_config = _STRICT
    determinism_runs: int = Field(default=2, ge=2)
    dataloader_start_methods: list[str] = Field(default_factory=lambda: ["fork", "spawn"])


class TargetConfig(BaseModel):
    model_config = _STRICT
    task: str | None = None
    # pytest arguments; `false` declares that the repo has no test suite (pytest is not run).
    tests: list[str] | Literal[False] = Field(default_factory=lambda: ["tests"])
    timeout_s: float = Field(default=600, gt=0, le=MAX_TIMEOUT_S)
    entrypoint: EntrypointConfig | None = None
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    performance: PerformanceConfig = Field(default_factory=PerformanceConfig)
    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)

    @field_validator("tests")
    @classmethod
    def _tests_not_empty(cls, value: list[str] | Literal[False]) -> list[str] | Literal[False]:
        # An empty list would run pytest on the current folder's defaults, or on nothing: ambiguous.
        if value == []:
            raise ValueError("an empty list runs no suite; give the pytest arguments (the default is [\"tests\"]), or `tests = false` to declare that the repo has no test suite")
        return value

    @property
    def has_test_suite(self) -> bool:
        return self.tests is not False

    @field_validator("task")
    @classmethod
    def _task_is_one_path_segment(cls, value: str | None) -> str | None:
        return None if value is None else check_safe_name(value)


class ConfigError(Exception):
    """Invalid configuration: names the file and the key."""

    def __init__(self, file: str, key: str, message: str) -> None:
        super().__init__(f"{file}: {key}: {message}" if key else f"{file}: {message}")
        self.file = file
        self.key = key
        self.message = message


def load_config(root: Path) -> tuple[TargetConfig, str | None]:
    """Return the configuration and the file it came from (None when the target has none)."""
    source, raw, prefix = _read_raw(root)
    if source is None:
        return TargetConfig(), None
    try:
        config = TargetConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join([prefix, *(str(p) for p in err["loc"])])
        raise ConfigError(source, key, err["msg"].removeprefix("Value error, ")) from None
    if config.entrypoint is not None:
        _check_callable(root, source, f"{prefix}.entrypoint.call", config.entrypoint.call)
        if config.entrypoint.setup:
            _check_callable(root, source, f"{prefix}.entrypoint.setup", config.entrypoint.setup)
    return config, source


def _read_raw(root: Path) -> tuple[str | None, dict[str, Any], str]:
    if not root.is_dir():
        raise ConfigError(str(root), "", "target is not a directory")
    for name, prefix in (("traingate.toml", ""), ("pyproject.toml", "tool.traingate")):
        path = root / name
        if not path.is_file():
            continue
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(name, "", f"not valid TOML: {exc}") from None
        if prefix:
            tool = data.get("tool", {})
            if not isinstance(tool, dict):
                raise ConfigError(name, "tool", "must be a table")
            section = tool.get("traingate")
            if section is None:
                continue
            if not isinstance(section, dict):
                raise ConfigError(name, prefix, "must be a table")
            return name, section, prefix
        return name, data, "traingate"
    return None, {}, ""


def _check_callable(root: Path, source: str, key: str, spec: str) -> None:
    """Resolve module:function by reading the target's files, without importing them."""
    module, _, func = spec.partition(":")
    parts = module.split(".")
    base = root.joinpath(*parts)
    candidates = [base.with_suffix(".py"), base / "__init__.py"]
    file = next((c for c in candidates if c.is_file()), None)
    if file is None:
        raise ConfigError(source, key, f"cannot import {module!r}: no {parts[-1]}.py or package under the target root")
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except SyntaxError as exc:
        # Importing would fail; the smoke call reports the crash with its location.
        del exc
        return
    if func not in _top_level_names(tree) and not _has_dynamic_names(tree):
        rel = file.relative_to(root).as_posix()
        raise ConfigError(source, key, f"{rel} defines no {func!r}")


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _has_dynamic_names(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and any(a.name == "*" for a in node.names):
            return True
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            return True
    return False
