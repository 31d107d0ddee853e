"""A warm-up's first step: a schedule that starts at lr 0 makes the optimizer's first step a
no-op by design (ineffective-step, reported low, at the schedule's line).

The schedule's line is where the scheduler was built when one set the rate; for a rate the
loop writes itself (`group["lr"] = lr`), the last such assignment before the step in the
function that made the step, read from the target's source (static: it only places the
finding, the zero rate itself was observed at the step).
"""

from __future__ import annotations

import ast
from pathlib import Path

from traingate.pipeline.model.schema import Location
from traingate.stages.correctness.probe.payloads import IneffectiveStep, StepsPayload


def first_steps_only(steps: StepsPayload, records: list[IneffectiveStep]) -> bool:
    """Whether the zero-rate steps are each optimizer's first step and nothing more, in a run
    that stepped on past them (the rate rose afterwards)."""
    optimizers = len(steps.optimizers) or 1
    per_optimizer = [r.optimizer for r in records]
    return (
        bool(records)
        and all(r.cause == "zero-lr" for r in records)
        and len(per_optimizer) == len(set(per_optimizer))
        and all(r.step < optimizers for r in records)
        and steps.steps > optimizers
    )


def lr_assignment(root: Path, path: str, step_line: int) -> Location | None:
    """The last `...["lr"] = ...` before `step_line` in the function of `path` around it."""
    try:
        tree = ast.parse((root / path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return None
    functions = [
        node for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.lineno <= step_line <= (node.end_lineno or node.lineno)
    ]
    if not functions:
        return None
    function = max(functions, key=lambda node: node.lineno)  # the innermost
    lines = [
        node.lineno for node in ast.walk(function)
        if isinstance(node, ast.Assign) and node.lineno < step_line and any(_is_lr_key(t) for t in node.targets)
    ]
    return Location(path=path, line=max(lines), function=function.name) if lines else None


def _is_lr_key(target: ast.expr) -> bool:
    return isinstance(target, ast.Subscript) and isinstance(target.slice, ast.Constant) and target.slice.value == "lr"
