"""Reading a target's configuration file: `traingate.toml`, or `[tool.traingate]` of
`pyproject.toml`, read as TOML (never imported), validated as `TargetConfig` (with every
registered stage's section), its entrypoint's names checked against the files they name, and
the inline waivers of its sources collected. Errors name the file and the key (`ConfigError`)."""

from __future__ import annotations
import ast
import importlib.machinery
import sys
from pathlib import Path
from typing import Any
from pydantic import ValidationError
from traingate.pipeline.model.tomlcompat import tomllib
from traingate.pipeline.model.config import TargetConfig, prepare_words


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
        return _with_waiver_sources(TargetConfig(), root, None), None
    try:
        config = TargetConfig.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = ".".join([prefix, *(str(p) for p in err["loc"])])
        raise ConfigError(source, key, err["msg"].removeprefix("Value error, ")) from None
    check_entrypoint(root, config, source, prefix)
    return _with_waiver_sources(config, root, source), source


def check_entrypoint(root: Path, config: TargetConfig, source: str, prefix: str) -> None:
    """The entrypoint's names against the files they name (ConfigError naming the key)."""
    ep = config.entrypoint
    if ep is not None and (ep.test is not None or ep.test_files):
        raise ConfigError(source, f"{prefix}.entrypoint.test", "set by the gate only: with no entrypoint configured, it observes the training of the tests itself")
    if ep is not None:
        if ep.script is not None:
            _check_script(root, source, f"{prefix}.entrypoint.script", ep.script)
        if ep.call is not None:
            _check_callable(root, source, f"{prefix}.entrypoint.call", ep.call, has_setup=ep.setup is not None)
        if ep.setup:
            _check_callable(root, source, f"{prefix}.entrypoint.setup", ep.setup)
        if ep.workdir is not None and not (root / ep.workdir).is_dir() or ep.workdir and not (root / ep.workdir).resolve().is_relative_to(root.resolve()):
            raise ConfigError(source, f"{prefix}.entrypoint.workdir", f"no folder {ep.workdir!r} under the target root")
        for index, command in enumerate(ep.prepare):
            _check_script(root, source, f"{prefix}.entrypoint.prepare[{index}]", prepare_words(command)[0])


def _with_waiver_sources(config: TargetConfig, root: Path, source: str | None) -> TargetConfig:
    # Imported here: the waivers module builds on this one.
    from traingate.pipeline.gate.waivers import scan_inline_waivers

    config._file = source
    config._inline_waivers = scan_inline_waivers(root)
    return config


def _read_raw(root: Path) -> tuple[str | None, dict[str, Any], str]:
    if not root.is_dir():
        raise ConfigError(str(root), "", "target is not a directory")
    return select_section({name: _text(root / name) for name in CONFIG_FILES})


def _text(path: Path) -> str | None:
    if not path.is_file():
        return None
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path.name, "", f"not valid TOML: {exc}") from None


# The files the configuration may be in, the one that wins first.
CONFIG_FILES = ("traingate.toml", "pyproject.toml")


def select_section(texts: dict[str, str | None]) -> tuple[str | None, dict[str, Any], str]:
    """The configuration among the files' texts (None: no such file): the file it came from,
    its table and the key prefix errors name; `traingate.toml` wins over `pyproject.toml`.
    The baseline's files, read from git, go through the same choice (`baseline_config`)."""
    for name, prefix in zip(CONFIG_FILES, ("", "tool.traingate"), strict=True):
        text = texts.get(name)
        if text is None:
            continue
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
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


def unresolved(root: Path, spec: str, *, has_setup: bool = True) -> str | None:
    """Why `module:function` (or `module:Class.method`) does not resolve in the files under
    `root`; None where it does (or reading cannot tell)."""
    try:
        _check_callable(root, "", "", spec, has_setup=has_setup)
    except ConfigError as exc:
        return exc.message
    return None


def _check_script(root: Path, source: str, key: str, script: str) -> None:
    path = root / script
    if not path.is_file():
        raise ConfigError(source, key, f"no file {script!r} under the target root")
    if not path.resolve().is_relative_to(root.resolve()):
        raise ConfigError(source, key, f"{script!r} leads outside the target root")


def _check_callable(root: Path, source: str, key: str, spec: str, *, has_setup: bool = True) -> None:
    """Resolve module:function or module:Class.method by reading the target's files, without
    importing them."""
    module, _, attr = spec.partition(":")
    func, *members = attr.split(".")
    parts = module.split(".")
    base = root.joinpath(*parts)
    candidates = [base.with_suffix(".py"), base / "__init__.py"]
    file = next((c for c in candidates if c.is_file()), None)
    if file is None:
        if installed_module_file(module, root) is not None:
            return  # a framework's own call (`lightning.pytorch:Trainer.fit`): its names are checked when called
        raise ConfigError(
            source, key, f"cannot import {module!r}: no {parts[-1]}.py or package under the target root, and no installed module of that name"
        )
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except SyntaxError as exc:
        # Importing would fail; the smoke call reports the crash with its location.
        del exc
        return
    rel = file.relative_to(root).as_posix()
    if func not in _top_level_names(tree) and not _has_dynamic_names(tree):
        raise ConfigError(source, key, f"{rel} defines no {func!r}")
    if members:
        _check_method(source, key, rel, tree, [func, *members], has_setup)


def installed_module_file(module: str, root: Path) -> Path | None:
    """The file of an installed module (a framework's, such as `lightning.pytorch`), found by
    the import system's path finder without importing it or its packages; None when it is not
    installed. The target root is no place to look: its modules are read from its files."""
    target = root.resolve()
    paths = [p for p in sys.path if p and not Path(p).resolve().is_relative_to(target)]
    spec = None
    for depth, _ in enumerate(module.split(".")):
        name = ".".join(module.split(".")[: depth + 1])
        spec = importlib.machinery.PathFinder.find_spec(name, paths)
        if spec is None:
            return None
        paths = list(spec.submodule_search_locations or [])
    return Path(spec.origin) if spec is not None and spec.origin and spec.origin not in ("built-in", "frozen") else None


def _check_method(source: str, key: str, rel: str, tree: ast.Module, path: list[str], has_setup: bool) -> None:
    """`Class.method` (or `Outer.Inner.method`): each class found by reading its body. A class
    with bases may inherit the method, and a name bound other than by `class` cannot be read:
    both are left to the smoke call."""
    scope: list[ast.stmt] = tree.body
    owner: ast.stmt | None = None
    for depth, name in enumerate(path):
        node = next((n for n in scope if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == name), None)
        last = depth == len(path) - 1
        if node is None:
            assigned = {t.id for n in scope if isinstance(n, (ast.Assign, ast.AnnAssign)) for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
            if isinstance(owner, ast.ClassDef) and not owner.bases and name not in assigned:
                raise ConfigError(source, key, f"{rel}: class {'.'.join(path[:depth])} defines no {name!r}")
            return
        if not last and not isinstance(node, ast.ClassDef):
            raise ConfigError(source, key, f"{rel}: {'.'.join(path[: depth + 1])} is not a class")
        owner, scope = node, node.body
    if isinstance(owner, (ast.FunctionDef, ast.AsyncFunctionDef)) and not has_setup and not _is_static_or_class_method(owner):
        raise ConfigError(
            source, key,
            f"{'.'.join(path)} is a method: give `setup`, a module:function returning the instance to call it on (or a dict with the instance under 'self' and keyword arguments)",
        )


def _is_static_or_class_method(func: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in func.decorator_list)


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
