"""The change's gate configuration against the baseline's, key by key: what narrows what is
verified, what only widens it (docs/configuration.md, "The baseline's verification is the floor").

Compared: `tests`, the entrypoint (`call`, `script`, `setup`, `args`, `amp_args`, `kwargs` key by
key, `amp_flag`, `seed`), `timeout_s`, every section of a stage (its own and those it declares
under keys of their own, such as `[distributed]`), and which file holds them. Not compared here: `[policy]` (the target may only tighten the CI's floor,
`policy_source`), the waivers (`waivers`, by the Adjudicator) and `task` (a name).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traingate.pipeline.gate.config_file import unresolved
from traingate.pipeline.model.config import EntrypointConfig, Stricter, TargetConfig, stricter_of
from traingate.pipeline.model.registry import config_sections, extra_sections

NARROWS = "narrows"
WIDENS = "widens"
NEUTRAL = "neutral"
FILE_KEY = "(file)"
_NOT_COMPARED = frozenset({"task", "policy", "waive", "entrypoint", "tests", "unverified"})
# Numbers whose larger value verifies more (a larger budget); in the stages' sections, the
# fields they mark `Stricter.HIGHER` (more runs, more ranks: `_more_is_wider`).
_MORE_IS_WIDER = frozenset({"timeout_s", "observe_tests"})
# Entrypoint keys that switch a comparison on when set (mixed precision on vs off).
_TURNS_ON = frozenset({"entrypoint.amp_flag", "entrypoint.amp_args"})


@dataclass(frozen=True)
class Difference:
    key: str
    baseline: Any
    current: Any
    effect: str  # NARROWS | WIDENS | NEUTRAL


def differences(base: TargetConfig, base_file: str | None, current: TargetConfig, current_file: str | None, *, pinned_suite: bool) -> list[Difference]:
    """Every difference, in the order the configuration reference lists the keys. With the suite
    pinned by the CI both versions run the CI's, so `tests` is not compared."""
    found: list[Difference] = []
    if base_file != current_file:
        found.append(Difference(FILE_KEY, base_file, current_file, NEUTRAL))
    if not pinned_suite:
        found += _tests(base.tests, current.tests)
    found += entrypoint_differences(base.entrypoint, current.entrypoint)
    before, after = _sections(base), _sections(current)
    for key in sorted(before.keys() | after.keys()):
        found += _section(key, before.get(key), after.get(key))
    return found


def _sections(config: TargetConfig) -> dict[str, Any]:
    dumped = config.model_dump(mode="json")
    return {key: value for key, value in dumped.items() if key not in _NOT_COMPARED}


def _tests(base: list[str] | bool | None, current: list[str] | bool | None) -> list[Difference]:
    """None: no `tests` set, what pytest collects by its own rules. Paths given where it was
    unset can only select from what it collected; unset where paths were given collects them
    and whatever else pytest finds."""
    if base == current:
        return []
    if current is False or base is None:
        return [Difference("tests", base, current, NARROWS)]
    if base is False or current is None:
        return [Difference("tests", base, current, WIDENS)]
    assert isinstance(base, list) and isinstance(current, list)
    removed = [a for a in base if a not in current]
    added = [a for a in current if a not in base]
    # An added option (`-k`, `-m`, `--deselect`, `-x`) can only select; an added path adds tests.
    narrows = bool(removed) or any(a.startswith("-") for a in added)
    return [Difference("tests", base, current, NARROWS if narrows else (WIDENS if added else NEUTRAL))]


def entrypoint_differences(base: EntrypointConfig | None, current: EntrypointConfig | None) -> list[Difference]:
    if base is None or current is None:
        if base == current:
            return []
        shown = [e.model_dump(mode="json", exclude_defaults=True) if e else None for e in (base, current)]
        return [Difference("entrypoint", shown[0], shown[1], WIDENS if base is None else NARROWS)]
    before, after = _entrypoint_flat(base), _entrypoint_flat(current)
    found = []
    for key in sorted(before.keys() | after.keys(), key=_entrypoint_order):
        old, new = before.get(key), after.get(key)
        if old != new:
            found.append(Difference(key, old, new, WIDENS if key in _TURNS_ON and old is None else NARROWS))
    return found


def _entrypoint_flat(ep: EntrypointConfig) -> dict[str, Any]:
    dumped = ep.model_dump(mode="json")
    flat = {f"entrypoint.{k}": v for k, v in dumped.items() if k != "kwargs"}
    flat.update({f"entrypoint.kwargs.{k}": v for k, v in dumped["kwargs"].items()})
    return flat


def _entrypoint_order(key: str) -> tuple[int, str]:
    fields = ["call", "script", "workdir", "prepare", "setup", "args", "amp_args", "kwargs", "amp_flag", "seed"]
    name = key.split(".")[1]
    return (fields.index(name) if name in fields else len(fields), key)


def _section(key: str, base: Any, current: Any) -> list[Difference]:
    if base == current:
        return []
    if isinstance(base, dict) and isinstance(current, dict):
        return [d for sub in sorted(base.keys() | current.keys()) for d in _section(f"{key}.{sub}", base.get(sub), current.get(sub))]
    return [Difference(key, base, current, _effect(key, base, current))]


def _effect(key: str, base: Any, current: Any) -> str:
    """A check turned on, a list that only grew and a larger number where more verifies more
    widen; everything else narrows, since the gate does not know that it does not."""
    if base is None:
        return WIDENS
    if current is None:
        return NARROWS
    if isinstance(base, list) and isinstance(current, list):
        return WIDENS if set(map(str, base)) <= set(map(str, current)) else NARROWS
    if key in _more_is_wider() and isinstance(base, (int, float)) and isinstance(current, (int, float)):
        return WIDENS if current > base else NARROWS
    return NARROWS


@functools.cache
def _more_is_wider() -> frozenset[str]:
    """`_MORE_IS_WIDER` and the registered stages' section fields a larger value of which verifies more."""
    sections = {**config_sections(), **extra_sections()}
    marked = {f"{key}.{name}" for key, model in sections.items() for name, field in model.model_fields.items() if stricter_of(field) is Stricter.HIGHER}
    return _MORE_IS_WIDER | marked


def baseline_entrypoint_gone(root: Path, ep: EntrypointConfig) -> str | None:
    """Why the baseline's entrypoint no longer applies to this version's files (an interface
    change: the function, script or setup renamed, a keyword no longer a parameter), read from
    the files; None where it still applies or reading cannot tell."""
    if ep.script is not None:
        return None if (root / ep.script).is_file() else f"its script {ep.script} is gone"
    if ep.setup is not None and (why := unresolved(root, ep.setup)) is not None:
        return f"its setup {ep.setup}: {why}"
    assert ep.call is not None
    if (why := unresolved(root, ep.call, has_setup=ep.setup is not None)) is not None:
        return f"{ep.call}: {why}"
    params = _parameters(root, ep.call)
    keywords = [*ep.kwargs, *([ep.amp_flag] if ep.amp_flag else [])]
    missing = [k for k in keywords if params is not None and k not in params]
    return f"{ep.call} takes no keyword {', '.join(missing)}" if missing else None


def _parameters(root: Path, call: str) -> set[str] | None:
    """The keyword parameters of the function `call` names, read from its file; None where it
    takes **kwargs or cannot be read."""
    module, _, attr = call.partition(":")
    base = root.joinpath(*module.split("."))
    file = next((c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()), None)
    try:
        scope: list[ast.stmt] = ast.parse(file.read_text(encoding="utf-8")).body if file else []
    except (SyntaxError, OSError, UnicodeDecodeError, ValueError):
        return None
    node: ast.stmt | None = None
    for name in attr.split("."):
        node = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)
        if node is None:
            return None
        scope = node.body
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or node.args.kwarg is not None:
        return None
    args = node.args
    return {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs]}
