"""Where the policy comes from: the CI, the built-in defaults, and the target, in that order of trust.

The code under review can add a line to its own `pyproject.toml`, so its `[policy]` is never
allowed to make the gate more lenient. The floor is the CI policy file (`--policy FILE` or the
`TRAINGATE_POLICY` environment variable) where it sets a value, else the built-in default; the
target may only tighten that floor:

- `block_on`: the union (the target can add severities that block, never remove one);
- each registered stage's thresholds (`Stage.policy_model`): the stricter value, as the stage
  marks its field (`Stricter.HIGHER`: the larger, a minimum such as `amp_speedup_min`, or true
  for a flag that blocks; `Stricter.LOWER`: the smaller, a tolerance such as
  `amp_accuracy_tolerance`);
- `interface_changes_block`: true over false;
- `block`: "all" over "new" (only the CI can let persisting findings through);
- `allow_waivers`: false over true (only the CI can allow the target's waivers, and it may forbid them);
- `tests`: the CI may pin the suite (its pytest arguments replace the target's `tests`); the
  target's own `[policy] tests` is ignored.
- `allow_config_changes`, `allow_new_waivers`: only the CI sets them (`CI_ONLY`); the target's
  own values are ignored and listed.

A target value that would loosen the floor is ignored and listed in the report. Only a CI
policy file can set a value below a default.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from traingate.pipeline.model.config import PolicyConfig, Stricter, TargetConfig, stricter_of
from traingate.pipeline.model.registry import policy_models
from traingate.pipeline.model.schema import IgnoredPolicySetting, PolicyProvenance, PolicySetting, Severity
from traingate.pipeline.model.tomlcompat import tomllib

POLICY_ENV = "TRAINGATE_POLICY"

DEFAULT = "default"
CI = "ci-policy"
TARGET = "target"

# For each of the gate's own keys the target may tighten: which of two values is the stricter one.
_STRICTER: dict[str, Callable[[Any, Any], Any]] = {
    "interface_changes_block": max,  # True (blocking) is the stricter
    "block": lambda a, b: "all" if "all" in (a, b) else "new",
    "allow_waivers": lambda a, b: bool(a and b),
}


# Keys a target may not set at all: what they allow is the change accepting itself.
CI_ONLY: dict[str, str] = {
    "allow_config_changes": "only the CI policy can accept a change's narrowing of its own gate configuration",
    "allow_new_waivers": "only the CI policy can let a change's new waivers apply",
    "reports": "only the CI policy chooses where the base commits' reports are kept: the change could otherwise point it at reports it wrote",
}


class PolicyFileError(Exception):
    """The CI policy file cannot be used; the message is one line naming the file and the key."""


@dataclass(frozen=True)
class CiPolicy:
    path: str
    policy: PolicyConfig  # fields_set: the keys the file sets


def ci_policy_path(option: Path | None, environ: dict[str, str] | None = None) -> Path | None:
    """`--policy` wins over `TRAINGATE_POLICY`; an empty variable counts as unset."""
    if option is not None:
        return option
    value = (os.environ if environ is None else environ).get(POLICY_ENV, "").strip()
    return Path(value) if value else None


def load_ci_policy(path: Path) -> CiPolicy:
    """Read a CI policy file: a TOML file with the keys of `[tool.traingate.policy]` at its top level."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyFileError(f"{path}: cannot read: {exc.strerror if isinstance(exc, OSError) and exc.strerror else exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise PolicyFileError(f"{path}: not valid TOML: {exc}") from None
    try:
        policy = PolicyConfig.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise PolicyFileError(f"{path}: {key}: {err['msg']}") from None
    return CiPolicy(path=str(path), policy=policy)


_BY_DIRECTION: dict[Stricter, Callable[[Any, Any], Any]] = {Stricter.HIGHER: max, Stricter.LOWER: min}


@dataclass(frozen=True)
class _Threshold:
    default: Any
    stricter: Callable[[Any, Any], Any]


def _thresholds() -> dict[str, _Threshold]:
    """The registered stages' thresholds, in the stages' order: each one's default and which
    of two values is the stricter (the registry checked that each field says)."""
    return {
        key: _Threshold(field.get_default(call_default_factory=True), _BY_DIRECTION[stricter_of(field) or Stricter.HIGHER])
        for model in policy_models().values()
        for key, field in model.model_fields.items()
    }


def resolve_policy(target: PolicyConfig, target_file: str | None, ci: CiPolicy | None) -> tuple[PolicyConfig, PolicyProvenance]:
    """The policy the decision uses, and the provenance of each of its values."""
    defaults = PolicyConfig()
    thresholds = _thresholds()
    keys = [*thresholds, *PolicyConfig.model_fields]
    floor: dict[str, tuple[Any, str]] = {}
    for key in keys:
        if ci is not None and key in ci.policy.model_fields_set:
            floor[key] = (getattr(ci.policy, key), CI)
        else:
            floor[key] = (thresholds[key].default if key in thresholds else getattr(defaults, key), DEFAULT)

    chosen: dict[str, Any] = {}
    settings: list[PolicySetting] = []
    ignored: list[IgnoredPolicySetting] = []
    asked = target.model_fields_set if target_file is not None else set()
    for key in keys:
        base, source = floor[key]
        if key not in asked:
            value = base
        elif key == "tests":
            value = base
            ignored.append(_ignored(key, target.tests, target_file, "only the CI policy can pin the suite; the target's own suite is its `tests` key"))
        elif key in CI_ONLY:
            value = base
            if getattr(target, key) != base:
                ignored.append(_ignored(key, getattr(target, key), target_file, CI_ONLY[key]))
        elif key == "block_on":
            value, source, dropped = _tighten_block_on(base, target.block_on, source)
            if dropped:
                names = ", ".join(s.value for s in dropped)
                ignored.append(_ignored(key, target.block_on, target_file, f"would stop {names} from blocking; the target may only add severities"))
        else:
            mine = getattr(target, key)
            value = (thresholds[key].stricter if key in thresholds else _STRICTER[key])(base, mine)
            if value != base:
                source = TARGET
            elif mine != base:
                ignored.append(_ignored(key, mine, target_file, f"looser than {base} ({source}); the target may only tighten thresholds"))
        chosen[key] = value
        settings.append(PolicySetting(key=key, value=_plain(value), source=source))
    provenance = PolicyProvenance(ci_file=ci.path if ci else None, settings=settings, ignored=ignored)
    return PolicyConfig(**chosen), provenance


def pin_suite(config: TargetConfig, policy: PolicyConfig, provenance: PolicyProvenance) -> tuple[TargetConfig, PolicyProvenance]:
    """Apply the CI's pinned suite, and say in the provenance where the test list came from:
    `ci-policy` (pinned), `target` (its `tests` key) or `default` (None: what pytest collects
    from the root by its own rules)."""
    if policy.tests is not None:
        config, source = config.model_copy(update={"tests": list(policy.tests)}), CI
    else:
        source = TARGET if "tests" in config.model_fields_set else DEFAULT
    settings = [s for s in provenance.settings if s.key != "tests"]
    settings.append(PolicySetting(key="tests", value=config.tests, source=source))
    return config, provenance.model_copy(update={"settings": settings})


def _tighten_block_on(base: list[Severity], mine: list[Severity], source: str) -> tuple[list[Severity], str, list[Severity]]:
    union = sorted(set(base) | set(mine), key=lambda s: s.rank)
    dropped = [s for s in base if s not in mine]
    return union, (TARGET if set(mine) - set(base) else source), dropped


def _ignored(key: str, value: Any, file: str | None, reason: str) -> IgnoredPolicySetting:
    return IgnoredPolicySetting(key=key, value=_plain(value), file=file or "", reason=reason)


def _plain(value: Any) -> Any:
    if isinstance(value, list):
        return [v.value if isinstance(v, Severity) else v for v in value]
    return value
