"""The top-level modules the target's Python files import, read with `ast` (nothing is run).

Used to say, when one import of a package this environment lacks stopped a run, which other
packages the target needs and does not have, so that one run lists them all. An import inside
`try: ... except ImportError` or `if TYPE_CHECKING:` is optional and left out; the target's own
modules (any file or package of its tree, wherever its folder is put on sys.path) and the
standard library are never missing.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# Folders never read: version control, caches, environments, build output.
_SKIPPED_DIRS = frozenset({".git", "__pycache__", ".venv", "venv", "env", "node_modules", "build", "dist", "site-packages", ".tox", ".nox", "traingate-reports"})
_MAX_FILES = 5000
_MAX_BYTES = 2 * 2**20
# Wall time the scan may take in a stage (measured on 2 CPU cores: 336 files of traingate's
# repository in 0.7 s; torch's own package, 2,285 large files, 433 of them in 5 s).
SCAN_BUDGET_S = 5.0
_OPTIONAL_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
_TEST_DIRS = frozenset({"tests", "test", "testing"})


@dataclass(frozen=True)
class ImportSite:
    """One absolute import statement of the target, by its top-level module."""

    module: str
    path: str  # relative to the target's root
    line: int
    in_tests: bool  # in a test module, a conftest or under a test folder


def python_files(root: Path) -> list[Path]:
    found: list[Path] = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED_DIRS and not d.startswith(".") and not d.endswith(".egg-info"))
        found += [Path(folder, f) for f in sorted(files) if f.endswith(".py")]
        if len(found) >= _MAX_FILES:
            break
    return found[:_MAX_FILES]


@functools.lru_cache(maxsize=8)
def own_modules(root: Path) -> frozenset[str]:
    """Every name under which the target's own code may be imported: each Python file's stem
    and each folder that holds Python files (read once per root: a stage asks for each failure)."""
    names: set[str] = set()
    for file in python_files(root):
        rel = file.relative_to(root)
        names.add(rel.stem)
        names.update(rel.parts[:-1])
    return frozenset(names)


@dataclass(frozen=True)
class ImportScan:
    sites: list[ImportSite]
    files_read: int
    files: int  # Python files found; more than files_read when the time budget ran out


def required_imports(root: Path, budget_s: float = SCAN_BUDGET_S) -> ImportScan:
    """The non-optional absolute imports of the target's Python files, in file order, read
    until `budget_s` has passed (a tree of thousands of large files takes tens of seconds)."""
    sites: list[ImportSite] = []
    files = python_files(root)
    deadline = time.monotonic() + budget_s
    for read, file in enumerate(files):
        if time.monotonic() > deadline:
            return ImportScan(sites, read, len(files))
        rel = PurePosixPath(file.relative_to(root).as_posix())
        try:
            if file.stat().st_size > _MAX_BYTES:
                continue
            tree = ast.parse(file.read_bytes(), filename=str(rel))
        except (OSError, SyntaxError, ValueError):
            continue
        in_tests = is_test_path(rel)
        sites += [ImportSite(module, rel.as_posix(), line, in_tests) for module, line in _ImportReader.read(tree)]
    return ImportScan(sites, len(files), len(files))


def is_test_path(rel: PurePosixPath) -> bool:
    name = rel.name
    return bool(_TEST_DIRS & set(rel.parts[:-1])) or name.startswith("test_") or name.endswith("_test.py") or name == "conftest.py"


def is_stdlib(module: str) -> bool:
    return module in sys.stdlib_module_names or module in sys.builtin_module_names or module == "__future__"


def is_installed(module: str) -> bool:
    """Whether this interpreter (the one the target's processes run) can import `module`;
    True when it cannot tell, so that nothing is called missing on a doubt."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError, AttributeError):
        return True


class _ImportReader(ast.NodeVisitor):
    """Collects (top-level module, line) of the absolute imports outside optional blocks."""

    def __init__(self) -> None:
        self.found: list[tuple[str, int]] = []

    @classmethod
    def read(cls, tree: ast.AST) -> list[tuple[str, int]]:
        reader = cls()
        reader.visit(tree)
        return reader.found

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [(alias.name.split(".")[0], node.lineno) for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level == 0 and node.module:
            self.found.append((node.module.split(".")[0], node.lineno))

    def visit_Try(self, node: ast.Try) -> None:
        # The try body's imports are optional when a handler catches their failure.
        if not any(_catches_import_error(h) for h in node.handlers):
            for child in node.body:
                self.visit(child)
        for handler in node.handlers:
            self.visit(handler)
        for child in [*node.orelse, *node.finalbody]:
            self.visit(child)

    visit_TryStar = visit_Try

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            for child in node.body:
                self.visit(child)
        for child in node.orelse:
            self.visit(child)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(_name_of(n) in _OPTIONAL_ERRORS for n in names)


def _is_type_checking(test: ast.expr) -> bool:
    return _name_of(test) == "TYPE_CHECKING"


def _name_of(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""
