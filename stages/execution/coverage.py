"""Does the test suite ever execute the entrypoint's body? (`entrypoint-untested`)

The entrypoint's function is found by reading its module with `ast` (never importing it);
the lines its body spans are compared with the lines coverage saw executed while the
suite ran. The `def` line itself runs whenever the module is imported, so it does not count.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext


@dataclass(frozen=True)
class EntrypointSource:
    """Where the entrypoint's code lives, as read from its file."""

    file: Path
    rel: str  # relative to the target root
    function: str
    def_line: int | None  # None: the function is not defined by a plain `def` in the module
    statements: frozenset[int] = field(default_factory=frozenset)  # first lines of the body's statements
    span: frozenset[int] = field(default_factory=frozenset)  # every line of the body, nested defs' bodies excluded


def module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    return next((c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()), None)


def entrypoint_source(root: Path, call: str) -> EntrypointSource | None:
    """Read `module:function` from the target's files; None when the module file is not there."""
    module, _, function = call.partition(":")
    file = module_file(root, module)
    if file is None:
        return None
    rel = file.relative_to(root).as_posix()
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return EntrypointSource(file=file, rel=rel, function=function, def_line=None)
    node = _find_def(tree, function.split(".")[-1])
    if node is None:
        return EntrypointSource(file=file, rel=rel, function=function, def_line=None)
    statements, span = body_lines(node)
    return EntrypointSource(file=file, rel=rel, function=function, def_line=node.lineno, statements=frozenset(statements), span=frozenset(span))


def _find_def(tree: ast.Module, name: str) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The module-level `def name`, else the first `def name` anywhere (a method, a nested def)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def body_lines(func: ast.FunctionDef | ast.AsyncFunctionDef) -> tuple[set[int], set[int]]:
    """(first line of each statement, every line) of the body, without its docstring and
    without the bodies of functions or classes defined inside it (they run only when called)."""
    body = list(func.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    statements: set[int] = set()
    span: set[int] = set()
    nested: set[int] = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.stmt):
                statements.add(node.lineno)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                inner = node.body if isinstance(node.body, list) else [node.body]
                for part in inner:
                    nested.update(range(part.lineno, (part.end_lineno or part.lineno) + 1))
        span.update(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1))
    return statements - nested, span - nested


def executed_lines(data_file: Path, file: Path) -> set[int] | None:
    """Lines of `file` coverage recorded as executed; None when the data cannot be read."""
    try:
        from coverage import CoverageData

        data = CoverageData(basename=str(data_file))
        data.read()
        lines = data.lines(str(file.resolve()))
    except Exception:  # noqa: BLE001 - unreadable data means "not measured", reported as such
        return None
    return set(lines or [])


def coverage_details(source: EntrypointSource | None, executed: set[int] | None, note: str = "") -> dict[str, Any]:
    if source is None:
        return {"measured": False, "note": note or "no entrypoint configured"}
    hit = sorted(source.span & executed) if executed is not None else []
    return {
        "measured": executed is not None,
        "path": source.rel,
        "function": source.function,
        "def_line": source.def_line,
        "body_statements": len(source.statements),
        "executed_statements": len(source.statements & executed) if executed is not None else None,
        "executed_lines": hit[:200],
        "note": note,
    }


def untested_finding(ctx: StageContext, source: EntrypointSource, executed: set[int], command: str) -> Finding | None:
    """`entrypoint-untested`: no line of the entrypoint's body ran while the suite ran.

    The seed report's KeyError shipped because no test ever called the training function;
    a smoke call catches a crash, but only a test pins down what the function should do.
    Observed (coverage of the suite's own run), medium: reported, not blocking by default.
    """
    if not source.span or source.span & executed:
        return None
    return ctx.finding(
        category=Category.ENTRYPOINT_UNTESTED,
        severity=Severity.MEDIUM,
        title=f"The test suite never executes {source.function}",
        location=Location(path=source.rel, line=source.def_line, function=source.function),
        problem=f"While the suite ran, none of the {len(source.statements)} statements of {source.function}'s body ({source.rel}) was executed.",
        fix=f"Add a test that calls {source.function} on tiny inputs (a few steps, a tiny model) and checks its result.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"coverage of the suite's run: 0 of {len(source.statements)} body statements executed",
            data={"path": source.rel, "body_lines": [min(source.span), max(source.span)], "executed_body_lines": [], "command": command},
        ),
        key=f"untested {source.function}",
    )
