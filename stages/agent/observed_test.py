"""A test run as the entrypoint: where it runs, with which pytest arguments, and where a
finding that no observed frame locates points.

With no entrypoint configured, the gate hands the stages that observe training the test that
trained in the execution stage's run (`EntrypointConfig.test`). Its pytest run is pinned to
the target as the suite's is (`--rootdir`, `-c`, `--confcutdir`, its own temporary folder),
and, in its baseline form, runs in a view of the stage's tree with the baseline's test files
laid over it (`EntrypointConfig.test_files`, `traingate.stages.agent.tree_view`).
"""

from __future__ import annotations

import ast
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from traingate.pipeline.model.schema import Location
from traingate.stages.agent.pytest_config import find_pytest_config
from traingate.stages.agent.tree_view import build_view, remove_view

if TYPE_CHECKING:
    from traingate.stages.base import StageContext


@dataclass(frozen=True)
class TestTree:
    """The folder the test runs in (the stage's root, or the view of its baseline form) and
    pytest's arguments, the node id first."""

    __test__ = False  # not a pytest test class
    root: Path
    args: list[str]


@contextmanager
def observed_test_tree(ctx: StageContext) -> Iterator[TestTree | None]:
    """The tree and arguments of one run of the observed test, removed after it; None when
    the entrypoint is not a test."""
    ep = ctx.config.entrypoint
    if ep is None or ep.test is None:
        yield None
        return
    view = build_view(ctx.root, ep.test_files) if ep.test_files else None
    private = Path(tempfile.mkdtemp())
    try:
        yield TestTree(root=view or ctx.root, args=pinned_args(view or ctx.root, ep.test, private))
    finally:
        shutil.rmtree(private, ignore_errors=True)
        if view is not None:
            remove_view(view)


def observed_test_note(nodeid: str, needs: str) -> str:
    """Why a check that needs the training function's own arguments is not measured on the
    training a test runs (`needs`: what the check runs)."""
    return (
        f"not measured: the training observed is a test ({nodeid}), whose arguments the gate cannot set; "
        f"the check needs {needs}, and so a configured entrypoint ([tool.traingate.entrypoint])"
    )


def pinned_args(root: Path, nodeid: str, private: Path) -> list[str]:
    """pytest's arguments for one test, pinned to `root`; its own files go to `private` (a
    neutral temporary folder: the test can read these arguments)."""
    config_file = find_pytest_config(root, [nodeid])
    if config_file is None:
        config_file = private / "pytest.ini"
        config_file.write_text("[pytest]\n")
    return [
        nodeid, f"--rootdir={root}", "-c", str(config_file), f"--confcutdir={root}",
        "-p", "no:cacheprovider", f"--basetemp={private / 'tmp'}", "--tb=short", "-q",
    ]


def location_of_test(root: Path, nodeid: str) -> Location:
    """The `def` line of the test a node id names, read from its file (no line when it is not
    found there: a parametrised or generated test, a file that does not parse)."""
    path, _, rest = nodeid.partition("::")
    names = [part.split("[", 1)[0] for part in rest.split("::") if part]
    function = names[-1] if names else None
    try:
        tree: ast.AST = ast.parse((root / path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return Location(path=path, function=function)
    for name in names:
        found = next((n for n in ast.iter_child_nodes(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name), None)
        if found is None:
            return Location(path=path, function=function)
        tree = found
    line = getattr(tree, "lineno", None) if names else None
    return Location(path=path, line=line, function=function)
