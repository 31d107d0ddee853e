"""No function or method of the gate, the stages or the reports is longer than MAX_LINES
(its `def` line to its last, decorators and docstring included): a longer one does several
things, and is split by what it decides. Prints each offender as path:line and exits 1."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 60
FOLDERS = ("pipeline", "stages", "reports", "traingate")


def too_long(root: Path) -> list[str]:
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_LINES:
                        found.append(f"{path.relative_to(root)}:{node.lineno}: `{node.name}` is {lines} lines (at most {MAX_LINES})")
    return found


def main() -> int:
    found = too_long(Path(__file__).resolve().parent.parent)
    print("\n".join(found) or f"No function over {MAX_LINES} lines.")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
