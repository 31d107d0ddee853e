"""Reading the target's source (never importing it): hints that locate what the runs observed,
and the one static check a CPU allows for `non_blocking` copies.

- `nonblocking_reads`: `x = t.to("cpu", non_blocking=True)` whose result is read before any
  `synchronize()`. Only copies explicitly to the host count; `batch.to(device,
  non_blocking=True)` (host to device) is the recommended idiom. (`Tensor.cpu()` takes no
  non_blocking argument: `t.cpu(non_blocking=True)` raises, so it is no race.)
- `set_iterations`: loops and conversions over a set, whose order follows PYTHONHASHSEED for
  strings (and memory addresses for objects); used to locate an observed divergence.
- `entrypoint_location`: the `def` line of the configured entrypoint.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Iterator

from traingate.pipeline.model.schema import Location

_SKIP_DIRS = {".git", ".venv", "venv", "env", "site-packages", "dist-packages", "node_modules", "__pycache__", "tests", "test", ".tox", ".nox", "build", "dist"}
MAX_FILES = 2000
_READ_METHODS = {"item", "tolist", "numpy", "__array__", "__float__", "__int__"}
_READ_FUNCTIONS = {"float", "int", "bool", "print", "str", "repr", "list", "asarray", "array"}
_METADATA = {"shape", "dtype", "device", "size", "dim", "ndim", "is_pinned", "numel", "requires_grad"}
_ORDERING_CALLS = {"list", "tuple", "enumerate", "iter", "zip", "next"}


@dataclass(frozen=True)
class SourceHit:
    path: str
    line: int
    function: str
    code: str
    detail: str = ""

    def location(self) -> Location:
        return Location(path=self.path, line=self.line, function=self.function)

    def as_dict(self) -> dict[str, object]:
        return {"path": self.path, "line": self.line, "function": self.function, "code": self.code, "detail": self.detail}


def source_files(root: Path) -> Iterator[tuple[str, ast.Module, list[str]]]:
    """(relative path, tree, lines) of the target's own .py files, tests and venvs left out."""
    count = 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        for name in sorted(filenames):
            if not name.endswith(".py") or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py":
                continue
            path = Path(dirpath) / name
            try:
                text = path.read_text(encoding="utf-8")
                tree = ast.parse(text, filename=str(path))
            except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
                continue
            yield path.relative_to(root).as_posix(), tree, text.splitlines()
            count += 1
            if count >= MAX_FILES:
                return


def _scopes(tree: ast.Module) -> Iterator[tuple[str, list[ast.stmt]]]:
    yield "<module>", tree.body
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.body


def _line_of(node: ast.AST) -> int:
    """1-based line of a node; every node these checks report (calls, loops) has one."""
    return int(getattr(node, "lineno", 0))


def _own_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Nodes of a scope, nested function and class bodies left to their own scope."""
    stack: list[ast.AST] = list(reversed(body))
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def _blocks(body: list[ast.stmt]) -> Iterator[list[ast.stmt]]:
    """Every statement list of a scope (the body itself, loop, branch and handler bodies)."""
    yield body
    for node in _own_nodes(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        for name in ("body", "orelse", "finalbody"):
            block = getattr(node, name, None)
            if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
                yield block


# -- non_blocking device-to-host copies -------------------------------------------------------

def _is_cpu_device(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value == "cpu" or node.value.startswith("cpu:")
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "device" and node.args:
        return _is_cpu_device(node.args[0])
    return False


def is_host_copy(node: ast.AST) -> bool:
    """`t.to("cpu", non_blocking=True)`, `t.to(torch.device("cpu"), ...)`, `t.to(device="cpu", ...)`."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return False
    non_blocking = any(k.arg == "non_blocking" and isinstance(k.value, ast.Constant) and k.value.value is True for k in node.keywords)
    if not non_blocking:
        return False
    if node.func.attr == "to":
        device = [k.value for k in node.keywords if k.arg == "device"] + node.args[:1]
        return any(_is_cpu_device(d) for d in device)
    return False


def _is_sync(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "synchronize"


def _reads(stmt: ast.stmt, name: str) -> bool:
    parents: dict[ast.AST, ast.AST] = {}
    for node in ast.walk(stmt):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
    for node in ast.walk(stmt):
        if isinstance(node, ast.Name) and node.id == name and isinstance(node.ctx, ast.Load):
            parent = parents.get(node)
            if isinstance(parent, ast.Attribute) and parent.attr in _METADATA:
                continue
            return True
    return False


def _stores(stmt: ast.stmt, name: str) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, (ast.Store, ast.Del)) for n in ast.walk(stmt))


def nonblocking_reads(root: Path) -> list[SourceHit]:
    """Host copies made with non_blocking=True whose result is read before a synchronize()."""
    hits: list[SourceHit] = []
    for path, tree, lines in source_files(root):
        for function, body in _scopes(tree):
            for block in _blocks(body):
                for index, stmt in enumerate(block):
                    hits.extend(_copy_hits(path, lines, function, block, index, stmt))
    return sorted(set(hits), key=lambda h: (h.path, h.line))


def _copy_hits(path: str, lines: list[str], function: str, block: list[ast.stmt], index: int, stmt: ast.stmt) -> list[SourceHit]:
    found = []
    for node in _own_nodes([stmt]):
        if not is_host_copy(node):
            continue
        code = lines[_line_of(node) - 1].strip()
        immediate = _immediate_read(stmt, node)
        if immediate:
            found.append(SourceHit(path, _line_of(node), function, code, f"read at once by {immediate}, line {_line_of(node)}"))
            continue
        target = _assigned_name(stmt, node)
        if target is None:
            continue
        for later in block[index + 1:]:
            if any(_is_sync(n) for n in ast.walk(later)) or isinstance(later, ast.Return):
                break  # synchronised, or handed to the caller: not known to be read here
            if _reads(later, target):
                found.append(SourceHit(path, _line_of(node), function, code, f"`{target}` read at line {later.lineno}: {lines[later.lineno - 1].strip()}"))
                break
            if _stores(later, target):
                break
    return found


def _assigned_name(stmt: ast.stmt, copy: ast.AST) -> str | None:
    if isinstance(stmt, ast.Assign) and stmt.value is copy and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        return stmt.targets[0].id
    if isinstance(stmt, ast.AnnAssign) and stmt.value is copy and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def _immediate_read(stmt: ast.stmt, copy: ast.AST) -> str | None:
    """`t.to("cpu", non_blocking=True).numpy()`, `float(t.to("cpu", non_blocking=True))`."""
    for node in ast.walk(stmt):
        if isinstance(node, ast.Attribute) and node.value is copy and node.attr in _READ_METHODS:
            return f".{node.attr}()"
        if isinstance(node, ast.Call) and copy in node.args:
            func = node.func
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
            if name in _READ_FUNCTIONS:
                return f"{name}()"
    return None


# -- iteration over sets ------------------------------------------------------------------------

def _is_set_expr(node: ast.AST, names: set[str]) -> bool:
    if isinstance(node, (ast.Set, ast.SetComp)):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("set", "frozenset"):
        return True
    if isinstance(node, ast.Name) and node.id in names:
        return True
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" and f"self.{node.attr}" in names:
        return True
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitOr, ast.BitAnd, ast.Sub, ast.BitXor)):
        return _is_set_expr(node.left, names) or _is_set_expr(node.right, names)
    return False


def _set_names(tree: ast.Module) -> dict[ast.AST, set[str]]:
    """Per scope (module, function, class), the names bound to sets in it."""
    scopes: dict[ast.AST, set[str]] = {}
    for scope in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))]:
        names: set[str] = set()
        body = scope.body if isinstance(scope, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else []
        nodes = list(ast.walk(scope)) if isinstance(scope, ast.ClassDef) else list(_own_nodes(body))
        for node in nodes:
            if isinstance(node, ast.Assign) and _is_set_expr(node.value, names):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
                    elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
                        names.add(f"self.{target.attr}")
        scopes[scope] = names
    return scopes


def set_iterations(root: Path, only: set[str] | None = None) -> list[SourceHit]:
    """Loops, comprehensions and list()/enumerate() over sets in the target's files."""
    hits: list[SourceHit] = []
    for path, tree, lines in source_files(root):
        if only is not None and path not in only:
            continue
        scoped = _set_names(tree)
        class_names = {n for scope, names in scoped.items() if isinstance(scope, ast.ClassDef) for n in names if n.startswith("self.")}
        for function, body in _scopes(tree):
            scope_node = next((n for n in scoped if getattr(n, "body", None) is body), tree)
            names = scoped.get(scope_node, set()) | scoped.get(tree, set()) | class_names
            for node in _own_nodes(body):
                iterated = _iterated_set(node, names)
                if iterated is not None:
                    hits.append(SourceHit(path, _line_of(node), function, lines[_line_of(node) - 1].strip(), iterated))
    unique = {(h.path, h.line): h for h in sorted(hits, key=lambda h: h.detail, reverse=True)}
    return sorted(unique.values(), key=lambda h: (h.path, h.line))


def _iterated_set(node: ast.AST, names: set[str]) -> str | None:
    iters: list[ast.AST] = []
    if isinstance(node, (ast.For, ast.AsyncFor)):
        iters.append(node.iter)
    elif isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.DictComp)):
        iters.extend(g.iter for g in node.generators)
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _ORDERING_CALLS and node.args:
        if _is_set_expr(node.args[0], names):
            return f"{node.func.id}() over a set"
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join" and node.args:
        if _is_set_expr(node.args[0], names):
            return "str.join() over a set"
    for it in iters:
        if _is_set_expr(it, names):
            return "iterates a set"
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id in _ORDERING_CALLS and it.args and _is_set_expr(it.args[0], names):
            return f"iterates {it.func.id}() of a set"
    return None
