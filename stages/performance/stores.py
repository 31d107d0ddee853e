"""Where the target's source stores into a holder, found with `ast`: the lines that add to
the attribute, global or local a leak's tensors are held by (`self._outputs[step] = ...`,
`losses.append(loss)`), which is where the fix goes. Rebinding the name to a fresh container
(`self._outputs = {}`) is initialisation, not a store into it; rebinding it to an expression
that reads it (`total = total + loss`) is a store."""

from __future__ import annotations

import ast
from pathlib import Path
from traingate.stages.contract.payloads.base import Site
from traingate.stages.performance.probe.payloads import HolderRecord

_ADDERS = {"append", "extend", "insert", "add", "update", "setdefault", "appendleft", "extendleft", "__setitem__"}


def storing_lines(root: Path, holder: HolderRecord) -> list[Site]:
    """Lines in the holder's source that store into it, as sites: for an attribute, the
    methods of its class; for a global, the whole module; for a local, its function."""
    path = holder.path
    if foreign(root, holder):
        return []  # a framework's object: its stores are the framework's, not what the repo changes
    try:
        source = (root / path).read_text(encoding="utf-8", errors="replace")
        tree = ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return []
    kind, name = holder.kind, holder.name
    scopes: list[ast.AST]
    if kind == "attribute":
        cls = holder.owner.rsplit(".", 1)[-1]
        scopes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == cls]
    elif kind == "local":
        line = holder.line
        scopes = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.lineno <= line <= (n.end_lineno or n.lineno) and n.name == holder.owner]
    else:
        scopes = [tree]
    lines = source.splitlines()
    found: dict[int, Site] = {}
    for scope in scopes:
        for node, function in _with_functions(scope):
            if _stores_into(node, name, attribute=kind == "attribute"):
                line = int(getattr(node, "lineno", 0))  # stores are statements and calls: they all have one
                found.setdefault(line, Site(path=path, line=line, function=function, code=lines[line - 1].strip()))
    return [found[k] for k in sorted(found)]


def foreign(root: Path, holder: HolderRecord) -> bool:
    """The holder belongs to code outside the target's tree (an installed framework's class or module)."""
    path = Path(holder.path)
    return path.is_absolute() or ".." in path.parts or not (root / path).is_file()


def _with_functions(scope: ast.AST) -> list[tuple[ast.AST, str]]:
    out: list[tuple[ast.AST, str]] = []

    def visit(node: ast.AST, function: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else function
            if isinstance(child, ast.stmt):
                out.append((child, inner))
            visit(child, inner)

    visit(scope, getattr(scope, "name", "<module>"))
    return out


def _is_holder(node: ast.AST, name: str, attribute: bool) -> bool:
    """`self.<name>` (any object's attribute of that name) or the bare name."""
    if attribute:
        return isinstance(node, ast.Attribute) and node.attr == name
    return isinstance(node, ast.Name) and node.id == name


def _rooted_at(node: ast.AST, name: str, attribute: bool) -> bool:
    """`holder[...]`, `holder[...][...]`: a subscript chain that starts at the holder."""
    while isinstance(node, ast.Subscript):
        node = node.value
        if _is_holder(node, name, attribute):
            return True
    return False


def _reads(value: ast.AST, name: str, attribute: bool) -> bool:
    return any(_is_holder(node, name, attribute) for node in ast.walk(value))


def _stores_into(node: ast.AST, name: str, attribute: bool) -> bool:
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            if _rooted_at(target, name, attribute):
                return True
            # `holder += [x]` grows it in place.
            if isinstance(node, ast.AugAssign) and _is_holder(target, name, attribute):
                return True
            # `total = total + loss` rebinds the name to what it held and more.
            if isinstance(node, ast.Assign) and _is_holder(target, name, attribute) and _reads(node.value, name, attribute):
                return True
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        func = node.value.func
        if isinstance(func, ast.Attribute) and func.attr in _ADDERS:
            owner = func.value
            return _is_holder(owner, name, attribute) or _rooted_at(owner, name, attribute)
    return False
