"""The clearing calls that exist in the training code and did not run, and the branch that
skipped each, found with `ast` in the functions that stepped and called backward: what a
stale-gradients finding points at when the fix is not to add a `zero_grad()` but to take one
out from under a condition (`if self.scheduler: self.scheduler.step(); self.optimizer.zero_grad()`
with no scheduler configured).

Which calls ran is observed (`probe.clears` counts every `zero_grad()` at its line); which exist
and where they sit is read from the source."""

from __future__ import annotations

import ast
from collections.abc import Mapping
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
    branch_line: int | None  # the statement (or `except` clause) whose branch kept the call from running; None: no enclosing branch
    branch_code: str
    branch_arm: str  # "body", "else", "loop" or "handler"
    calls: int = 0  # how often it ran in the run
    steps: int = 0  # the run's optimizer steps

    def describe(self) -> str:
        """How the branch kept the call from running: `under `if self.scheduler:` (line 31)`."""
        if self.calls:
            where = f"under `{self.branch_code}` (line {self.branch_line})" if self.branch_line is not None else "outside the code that steps"
            return f"{where}, and ran {self.calls} time(s) in {self.steps} optimizer step(s)"
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
            "calls": self.calls,
        }


@dataclass(frozen=True)
class _Arm:
    """One branch above a clearing call: the statement, which arm holds the call, and the lines
    that arm spans."""

    node: ast.stmt | ast.excepthandler
    arm: str
    first: int
    last: int

    def holds(self, lines: set[int]) -> bool:
        return any(self.first <= line <= self.last for line in lines)


def skipped_clears(root: Path, where: list[tuple[str, int]], calls: Mapping[tuple[str, int], int], steps: int) -> list[SkippedClear]:
    """The `zero_grad()` calls in the functions holding the lines `where` ((path, line): the step,
    the backward) that ran at fewer than `steps` steps (`calls`: how often each (path, line)
    ran), each with the branch that kept it from running, the likeliest cause first.

    The branch named is the outermost one above the call that the run never entered (no line
    that ran lies in that arm); for a call that ran now and then, its innermost branch. A call
    that ran but sits outside the loop that steps (a clear before the loop) is no candidate: it
    was never meant to run at every step. The
    likeliest cause is the clear nearest the step: the one inside the most branches that also
    hold the step or the backward (a clear under the step's own `if` was meant to follow it;
    one at the top of the function that runs on an epoch's first batch was not), then the one
    that ran least, then source order."""
    found: dict[tuple[str, int], tuple[tuple[int, int, int], SkippedClear]] = {}
    for path, line in where:
        source, tree = _parse(root / path)
        if tree is None:
            continue
        lines = source.splitlines()
        anchors = {at for p, at in where if p == path}
        reached = anchors | {at for (p, at), n in calls.items() if p == path and n > 0}
        for function in _functions_holding(tree, line):
            loop = _innermost_loop(function, line)
            for call, chain in _clearing_calls(function):
                key, ran = (path, call.lineno), calls.get((path, call.lineno), 0)
                if ran >= steps or key in found:
                    continue
                if ran and loop is not None and not any(arm.node is loop for arm in chain):
                    continue  # it ran, outside the loop that steps: a clear before the loop, not one skipped
                skipping = next((arm for arm in chain if not arm.holds(reached)), None) if not ran else None
                branch = skipping or (chain[-1] if chain else None)
                near = sum(1 for arm in chain if arm.holds(anchors))
                found[key] = ((-near, ran, call.lineno), SkippedClear(
                    path=path, line=call.lineno, function=function.name, code=_text(lines, call.lineno),
                    branch_line=branch.node.lineno if branch else None, branch_code=_header(lines, branch.node) if branch else "",
                    branch_arm=branch.arm if branch else "", calls=ran, steps=steps,
                ))
    return [clear for _, clear in sorted(found.values(), key=lambda item: item[0])]


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


def _innermost_loop(function: ast.AST, line: int) -> ast.stmt | None:
    """The innermost loop of the function (not of a function nested in it) whose body holds `line`."""
    found: ast.stmt | None = None

    def visit(node: ast.AST) -> None:
        nonlocal found
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                continue
            if isinstance(child, (ast.For, ast.AsyncFor, ast.While)) and child.body and child.body[0].lineno <= line <= (child.body[-1].end_lineno or child.lineno):
                found = child
            visit(child)

    visit(function)
    return found


def _clearing_calls(function: ast.AST) -> list[tuple[ast.Call, list[_Arm]]]:
    """Every `<x>.zero_grad(...)` call in the function (not in functions nested in it), with the
    branches above it, outermost first (an `except` clause is a branch of its own)."""
    out: list[tuple[ast.Call, list[_Arm]]] = []

    def visit(node: ast.AST, chain: list[_Arm]) -> None:
        for field, value in ast.iter_fields(node):
            children = value if isinstance(value, list) else [value]
            arm = _arm(node, field) if isinstance(node, BRANCHES) else None
            for child in children:
                if not isinstance(child, ast.AST) or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
                    continue
                inner = chain
                if arm is not None and isinstance(node, ast.stmt) and isinstance(child, ast.stmt | ast.excepthandler):
                    owner = child if arm == "handler" else node
                    span = [child] if arm == "handler" else [c for c in children if isinstance(c, ast.stmt)]
                    inner = [*chain, _Arm(owner, arm, span[0].lineno, max(c.end_lineno or c.lineno for c in span))]
                if isinstance(child, ast.Call) and isinstance(child.func, ast.Attribute) and child.func.attr == CLEARING:
                    out.append((child, inner))
                visit(child, inner)

    visit(function, [])
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
