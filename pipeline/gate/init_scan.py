"""`traingate init`, first part: find a repo's training entry points by reading its files.

Nothing is imported: each `.py` file under the root is parsed with `ast`. A function or method
*trains* when its own body calls `backward` (`loss.backward()`, `accelerator.backward(loss)`,
`scaler.scale(loss).backward()`) and an optimizer's `step` (`optimizer.step()`,
`scaler.step(optimizer)`; a scheduler's is not one), or a framework's loop (`trainer.fit(...)`,
`Trainer(...).fit(...)`, `trainer.train()`). A function that calls one that trains (by name,
across the repo) reaches training; so does a script whose `if __name__ == "__main__":` block
does, and a test function that does.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

# Folders that are never the repo's own code.
SKIPPED_FOLDERS = frozenset({".git", ".venv", "venv", "env", "node_modules", "build", "dist", "site-packages", "traingate-reports", "__pycache__", ".tox", ".eggs"})
MAX_FILES = 2000
MAX_FILE_BYTES = 1_000_000

Kind = Literal["script", "function", "method", "test", "framework"]
# Base classes that make a class a framework's training module (Lightning's shape).
FRAMEWORK_MODULES = frozenset({"LightningModule"})


@dataclass(frozen=True)
class Param:
    name: str
    default: object = None
    has_default: bool = False
    literal: bool = True  # the default is a literal traingate can read


@dataclass(frozen=True)
class Option:
    """One `parser.add_argument(...)` of a script."""

    flags: tuple[str, ...]
    dest: str
    default: object = None
    has_default: bool = False
    required: bool = False
    positional: bool = False
    store_true: bool = False
    store_false: bool = False
    line: int = 0

    @property
    def flag(self) -> str:
        longs = [f for f in self.flags if f.startswith("--")]
        return (longs or list(self.flags))[0]


@dataclass
class Function:
    """One function or method of the repo, with what its body calls."""

    path: str  # relative to the root
    module: str  # dotted, as importable from the root
    qualname: str  # `train` or `Trainer.fit`
    line: int
    params: list[Param]
    calls: set[str]
    is_method: bool
    is_static: bool
    trains: str | None = None  # how its own body trains: "loop", "fit", "train", else None
    reaches: str | None = None  # the qualname of what it calls that trains


@dataclass
class Script:
    path: str
    main_line: int  # the `if __name__ == "__main__":` line
    main_calls: set[str]
    options: list[Option]
    trains_at_module_level: bool
    has_main: bool = True  # an `if __name__ == "__main__":` block; else its module-level code runs


@dataclass
class Found:
    """What the scan read: the training functions, scripts, tests, framework modules."""

    root: Path
    functions: list[Function] = field(default_factory=list)
    scripts: list[Script] = field(default_factory=list)
    framework_modules: list[tuple[str, str, int]] = field(default_factory=list)  # (path, module:Class, line)
    # module:Class -> its constructor's parameters; None when they cannot be read (a base
    # class may define them)
    constructors: dict[str, list[Param] | None] = field(default_factory=dict)
    conftests: set[str] = field(default_factory=set)  # folders holding a conftest.py
    imports: set[str] = field(default_factory=set)  # top-level packages the repo imports
    downloads: list[tuple[str, int, str]] = field(default_factory=list)  # (path, line, what)
    unreadable: list[str] = field(default_factory=list)
    files: int = 0

    def training(self) -> list[Function]:
        return [f for f in self.functions if f.trains or f.reaches]


def python_files(root: Path) -> Iterator[Path]:
    """The repo's `.py` files, in a stable order, outside virtual environments and builds."""
    count = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIPPED_FOLDERS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        count += 1
        if count > MAX_FILES:
            return
        yield path


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def scan(root: Path) -> Found:
    found = Found(root=root)
    for path in python_files(root):
        rel = path.relative_to(root)
        try:
            if path.stat().st_size > MAX_FILE_BYTES:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
            found.unreadable.append(rel.as_posix())
            continue
        found.files += 1
        _read_module(found, rel, tree)
    _propagate(found)
    return found


def _read_module(found: Found, rel: Path, tree: ast.Module) -> None:
    path, module = rel.as_posix(), module_name(rel)
    for node, qualname, is_method in _defs(tree.body, ""):
        calls = _calls(node.body)
        found.functions.append(Function(
            path=path, module=module, qualname=qualname, line=node.lineno, params=_params(node, is_method),
            calls={name for name, _ in calls}, is_method=is_method, is_static=_is_static(node), trains=_trains(calls),
        ))
    if rel.name == "conftest.py":
        found.conftests.add(rel.parent.as_posix())
    for cls, name in _classes(tree.body, ""):
        found.constructors[f"{module}:{name}"] = _constructor(cls)
    for any_node in ast.walk(tree):
        if isinstance(any_node, ast.ClassDef) and any(_last_name(b) in FRAMEWORK_MODULES for b in any_node.bases):
            found.framework_modules.append((path, f"{module}:{any_node.name}", any_node.lineno))
        if isinstance(any_node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in any_node.names] if isinstance(any_node, ast.Import) else [any_node.module or ""]
            found.imports.update(name.split(".")[0] for name in names)
        if isinstance(any_node, ast.Call) and _downloads(any_node):
            found.downloads.append((path, any_node.lineno, ast.unparse(any_node.func)))
    main = next((n for n in tree.body if isinstance(n, ast.If) and _is_main_guard(n.test)), None)
    module_level = [n for n in tree.body if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    module_calls = _calls(module_level)
    trains_here = _trains(module_calls) is not None
    # A script without a `__main__` block trains when it is run (or imported): its
    # module-level calls are what it runs. A test file is never run as a script.
    pytest_file = _is_test_file(rel) and any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name.startswith("test") for n in tree.body)
    if main is not None or (module_calls and not pytest_file and rel.name != "__init__.py"):
        found.scripts.append(Script(
            path=path, main_line=main.lineno if main is not None else _first_call_line(module_level),
            main_calls={name for name, _ in (_calls(main.body) if main is not None else module_calls)},
            options=_options(tree), trains_at_module_level=trains_here, has_main=main is not None,
        ))


def _first_call_line(statements: list[ast.stmt]) -> int:
    return next((n.lineno for n in statements if any(isinstance(c, ast.Call) for c in ast.walk(n))), 1)


def _is_test_file(rel: Path) -> bool:
    return rel.name.startswith("test_") or rel.name.endswith("_test.py") or rel.name == "conftest.py"


def is_test_path(path: str) -> bool:
    """A file pytest collects by its default `python_files`."""
    return _is_test_file(Path(path)) and Path(path).name != "conftest.py"


def is_test(function: Function) -> bool:
    """A test pytest collects: `test*` at module level of a test file, or a `test*` method of a
    class there (a `Test*` class, a `unittest.TestCase`)."""
    return function.qualname.rsplit(".", 1)[-1].startswith("test") and function.qualname.count(".") <= 1 and _is_test_file(Path(function.path))


def _defs(body: list[ast.stmt], prefix: str) -> Iterator[tuple[ast.FunctionDef | ast.AsyncFunctionDef, str, bool]]:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node, prefix + node.name, bool(prefix)
        elif isinstance(node, ast.ClassDef):
            yield from _defs(node.body, f"{prefix}{node.name}.")


def _classes(body: list[ast.stmt], prefix: str) -> Iterator[tuple[ast.ClassDef, str]]:
    for node in body:
        if isinstance(node, ast.ClassDef):
            yield node, prefix + node.name
            yield from _classes(node.body, f"{prefix}{node.name}.")


def _constructor(node: ast.ClassDef) -> list[Param] | None:
    init = next((n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
    if init is not None:
        return _params(init, True)
    # No __init__ of its own: object's, unless a base class (other than object) gives one.
    return [] if all(isinstance(b, ast.Name) and b.id == "object" for b in node.bases) else None


def _calls(body: list[ast.stmt]) -> list[tuple[str, str]]:
    """(called name, receiver's source) of every call in `body`, nested functions left out. A
    receiver that is a name assigned once from a call (`t = L.Trainer(...)`, `t = make_trainer()`)
    is given as that call's callee, so `t.fit(...)` reads as a trainer's fit."""
    found: list[tuple[str, str]] = []
    made: dict[str, list[str]] = {}  # name -> the callees of the calls assigned to it
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            if isinstance(node.func, ast.Name):
                found.append((node.func.id, ""))
            elif isinstance(node.func, ast.Attribute):
                found.append((node.func.attr, ast.unparse(node.func.value)))
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            made.setdefault(node.targets[0].id, []).append(ast.unparse(node.value.func))
        stack.extend(ast.iter_child_nodes(node))
    callee = {name: callees[0] for name, callees in made.items() if len(callees) == 1}
    return [(name, callee.get(receiver, receiver)) for name, receiver in found]


def _trains(calls: list[tuple[str, str]]) -> str | None:
    backward = any(name == "backward" for name, _ in calls)
    step = any(name == "step" and "sched" not in receiver.lower() and "lr" not in receiver.lower().split(".")[-1] for name, receiver in calls)
    if backward and step:
        return "loop"
    for name, receiver in calls:
        owner = receiver.lower()
        if name == "fit" and "trainer" in owner:
            return "fit"
        if name == "train" and "trainer" in owner:
            return "train"
    return None


def _params(node: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> list[Param]:
    args = node.args
    positional = [*args.posonlyargs, *args.args]
    if is_method and positional and not _is_static(node):
        positional = positional[1:]  # self / cls
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = [_param(a.arg, d) for a, d in zip(positional, defaults, strict=True)]
    params += [_param(a.arg, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)]
    return params


def _param(name: str, default: ast.expr | None) -> Param:
    if default is None:
        return Param(name)
    try:
        return Param(name, ast.literal_eval(default), True)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return Param(name, ast.unparse(default), True, literal=False)


def _is_static(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(isinstance(d, ast.Name) and d.id in ("staticmethod", "classmethod") for d in node.decorator_list)


def _last_name(node: ast.expr) -> str:
    return node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
        and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == "__main__"
    )


def _downloads(call: ast.Call) -> bool:
    """A call that fetches data: `download=True`, `urlretrieve`, `load_dataset`, `snapshot_download`."""
    name = _last_name(call.func)
    if name in ("urlretrieve", "load_dataset", "snapshot_download", "hf_hub_download"):
        return True
    return any(k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True for k in call.keywords)


def _options(tree: ast.Module) -> list[Option]:
    options: list[Option] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and _last_name(node.func) == "add_argument" and node.args):
            continue
        flags = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
        if not flags:
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        positional = not flags[0].startswith("-")
        dest = _literal(keywords.get("dest")) or (flags[0] if positional else max(flags, key=len)).lstrip("-").replace("-", "_")
        action = _literal(keywords.get("action"))
        default_node = keywords.get("default")
        options.append(Option(
            flags=flags, dest=str(dest), default=_literal(default_node), has_default=default_node is not None or action in ("store_true", "store_false"),
            required=bool(_literal(keywords.get("required"))) or (positional and _literal(keywords.get("nargs")) not in ("?", "*")),
            positional=positional, store_true=action == "store_true", store_false=action == "store_false", line=node.lineno,
        ))
    return options


def _literal(node: ast.expr | None) -> object:
    if node is None:
        return None
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return ast.unparse(node)


def _propagate(found: Found) -> None:
    """Mark what reaches training through the functions it calls, by name, to a fixed point."""
    by_name: dict[str, Function] = {}
    for function in found.functions:
        if function.trains:
            by_name.setdefault(function.qualname.rsplit(".", 1)[-1], function)
    changed = True
    while changed:
        changed = False
        for function in found.functions:
            if function.trains or function.reaches:
                continue
            reached = next((by_name[c] for c in sorted(function.calls) if c in by_name and by_name[c] is not function), None)
            if reached is not None:
                function.reaches = reached.qualname
                by_name.setdefault(function.qualname.rsplit(".", 1)[-1], function)
                changed = True


def script_reaches(found: Found, script: Script) -> str | None:
    """What the script's `__main__` block runs that trains, or None."""
    if script.trains_at_module_level:
        return "its module-level code"
    local = {f.qualname: f for f in found.functions if f.path == script.path and not f.is_method}
    training = {f.qualname.rsplit(".", 1)[-1]: f for f in found.training()}
    for name in sorted(script.main_calls):
        function = local.get(name) or training.get(name)
        if function is not None and (function.trains or function.reaches):
            return function.qualname
    return None
