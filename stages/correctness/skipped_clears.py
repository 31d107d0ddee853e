"""The clearing calls that exist in the training code and did not run, and the branch that
skipped each, found with `ast` in the functions that stepped and called backward: what a
stale-gradients finding points at when the fix is not to add a `zero_grad()` but to take one
out from under a condition (`if self.scheduler: self.scheduler.step(); self.optimizer.zero_grad()`
with no scheduler configured).

Which calls ran is observed (`probe.clears` counts every `zero_grad()` at its line); which exist
and where they sit is read from the source."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

CLEARING = "zero_grad"
BRANCHES = (ast.If, ast.While, ast.For, ast.AsyncFor, ast.Try)


@dataclass(frozen=True)
class SkippedClear:
    path: str
    line: int
    function: str
    code: str
    branch_line: int | None  # the statement (or `except` clause) whose branch holds the call; None: no enclosing branch
    branch_code: str
    branch_arm: str  # "body", "else", "loop" or "handler"

    def describe(self) -> str:
        """How the branch kept the call from running: `under `if self.scheduler:` (line 31)`."""
        if self.branch_line is None:
            return "where the run never reached it"
        if self.branch_arm == "else":
            return f"in the `else` of `{self.branch_code}` (line {self.branch_line}), whose condition held at every step"
        if self.branch_arm == "loop":
            return f"inside `{self.branch_code}` (line {self.branch_line}), a loop that never ran its body"
        if self.branch_arm == "handler":
            return f"in `{self.branch_code}` (line {self.branch_line}), a handler never entered"
        return f"under `{self.branch_code}` (line {self.branch_line}), whose condition was false at every step"

    def data(self) -> dict[str, object]:
        return {
            "path": self.path, "line": self.line, "function": self.function, "code": self.code,
            "branch_line": self.branch_line, "branch_code": self.branch_code, "branch_arm": self.branch_arm,
        }


def skipped_clears(root: Path, where: list[tuple[str, int]], ran: set[tuple[str, int]]) -> list[SkippedClear]:
    """`zero_grad()` calls in the functions holding the lines `where` ((path, line): the step,
    the backward) that never ran (no line in `ran`), in source order, each with its branch."""
    found: dict[tuple[str, int], SkippedClear] = {}
    for path, line in where:
        source, tree = _parse(root / path)
        if tree is None:
            continue
        lines = source.splitlines()
        for function in _functions_holding(tree, line):
            for call, branch, arm in _clearing_calls(function):
                key = (path, call.lineno)
                if key in ran or key in found:
                    continue
                found[key] = SkippedClear(
                    path=path, line=call.lineno, function=function.name, code=_text(lines, call.lineno),
                    branch_line=branch.lineno if branch else None, branch_code=_header(lines, branch) if branch else "", branch_arm=arm,
                )
    return [found[k] for k in sorted(found)]


def _parse(file: Path) -> tuple[str, ast.Module | None]:
    try:
        source = file.read_text(encoding="utf-8", errors="replace")
        return source, ast.parse(source)
    except (OSError, SyntaxError, ValueError):
        return "", None


def _functions_holding(tree: ast.AST, line: int) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The innermost function whose body spans `line`."""
    holding = [
        node for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= line <= (node.end_lineno or node.lineno)
    ]
    return [max(holding, key=lambda n: n.lineno)] if holding else []


def _clearing_calls(function: ast.AST) -> list[tuple[ast.Call, ast.stmt | ast.excepthandler | None, str]]:
    """Every `<x>.zero_grad(...)` call in the function (not in functions nested in it), with
    the innermost branch statement above it and which arm of it holds the call."""
    out: list[tuple[ast.Call, ast.stmt | ast.excepthandler | None, str]] = []

    def visit(node: ast.AST, branch: ast.stmt | ast.excepthandler | None, arm: str) -> None:
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            for child in children:
                if not isinstance(child, ast.AST) or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    continue
                inner, inner_arm = branch, arm
                branch_arm = _arm(node, field) if isinstance(node, BRANCHES) and isinstance(child, ast.stmt | ast.excepthandler) else None
                if branch_arm is not None and isinstance(node, ast.stmt) and isinstance(child, ast.stmt | ast.excepthandler):
                    inner, inner_arm = (child if branch_arm == "handler" else node), branch_arm  # an `except` clause is its own branch
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == CLEARING:
                    out.append((child, inner, inner_arm))
                visit(child, inner, inner_arm)

    visit(function, None, "")
    return out


def _arm(node: ast.AST, field: str) -> str | None:
    """Which arm of a branch statement `field` is; None where that arm runs whenever the
    statement does (a `try` body, a loop's `else`): the branch above it is the one to name."""
    if isinstance(node, ast.If):
        return "else" if field == "orelse" else "body"
    if isinstance(node, ast.Try):
        return "handler" if field == "handlers" else None
    return "loop" if field == "body" else None


def _text(lines: list[str], line: int) -> str:
    return lines[line - 1].strip() if 0 < line <= len(lines) else ""


def _header(lines: list[str], node: ast.stmt | ast.excepthandler) -> str:
    """The branch statement's first line, as written (`if self.scheduler:`)."""
    return _text(lines, node.lineno)
