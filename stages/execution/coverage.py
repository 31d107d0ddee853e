"""Does the test suite ever execute the code the entrypoint reaches? (`entrypoint-untested`)

The entrypoint's code is found by reading its file with `ast` (never importing it); the lines
it spans are compared with the lines coverage saw executed while the suite ran. What counts:

- a function (`module:function`): its body;
- a method (`module:Class.method`): the method's body, the class found by its name (nested
  classes by their dotted path);
- a script (`script = "train.py"`): what running it executes beyond importing it — its
  module-level statements other than imports, `def`/`class` lines and the docstring, the body
  of its `if __name__ == "__main__":` block, and the bodies of the functions and methods it
  defines.

Lines that run whenever the file is imported (a `def` line, an import) never count, and the
harness that makes the smoke call is not the target's code, so it is never counted either.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from traingate.pipeline.model.config import EntrypointConfig
from traingate.stages.execution.details import EntrypointCoverage, NoEntrypoint
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext
from traingate.stages.execution.rules import ENTRYPOINT_UNTESTED

FuncNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass(frozen=True)
class EntrypointSource:
    """Where the entrypoint's code lives, as read from its file."""

    file: Path
    rel: str  # relative to the target root
    function: str  # the function or Class.method; for a script, its path
    def_line: int | None  # None: not defined by a plain `def` in the file (and for a script)
    statements: frozenset[int] = field(default_factory=frozenset)  # first lines of the counted statements
    span: frozenset[int] = field(default_factory=frozenset)  # every counted line, nested defs' bodies excluded
    script: bool = False

    @property
    def first_line(self) -> int | None:
        """Where a finding about the whole entrypoint points: its `def`, or a script's first counted line."""
        return self.def_line if self.def_line is not None or not self.statements else min(self.statements)


def module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    return next((c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()), None)


def entrypoint_source(root: Path, entrypoint: EntrypointConfig | str) -> EntrypointSource | None:
    """Read the entrypoint's code from the target's files; None when its file is not there.
    A string is a `call` (module:function or module:Class.method)."""
    call = entrypoint if isinstance(entrypoint, str) else entrypoint.call
    if not isinstance(entrypoint, str) and entrypoint.script is not None:
        return _script_source(root, entrypoint.script)
    module, _, function = (call or "").partition(":")
    file = module_file(root, module)
    if file is None:
        return None
    rel = file.relative_to(root).as_posix()
    tree = _parse(file)
    node = _find_def(tree, function.split(".")) if tree is not None else None
    if node is None:
        return EntrypointSource(file=file, rel=rel, function=function, def_line=None)
    statements, span = body_lines(node)
    return EntrypointSource(file=file, rel=rel, function=function, def_line=node.lineno, statements=frozenset(statements), span=frozenset(span))


def _script_source(root: Path, script: str) -> EntrypointSource | None:
    file = root / script
    if not file.is_file():
        return None
    rel = Path(script).as_posix()
    tree = _parse(file)
    if tree is None:
        return EntrypointSource(file=file, rel=rel, function=rel, def_line=None, script=True)
    statements, span = script_lines(tree)
    return EntrypointSource(file=file, rel=rel, function=rel, def_line=None, statements=frozenset(statements), span=frozenset(span), script=True)


def _parse(file: Path) -> ast.Module | None:
    try:
        return ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
    except (SyntaxError, UnicodeDecodeError, ValueError):
        return None


def _find_def(tree: ast.Module, path: list[str]) -> FuncNode | None:
    """`function` at module level, or `Class.method` through the classes' bodies; for a single
    name not defined at module level, the first `def` of that name anywhere."""
    scope: list[ast.stmt] = tree.body
    for depth, name in enumerate(path):
        last = depth == len(path) - 1
        kinds: tuple[type, ...] = (ast.FunctionDef, ast.AsyncFunctionDef) if last else (ast.ClassDef,)
        node = next((n for n in scope if isinstance(n, kinds) and getattr(n, "name", None) == name), None)
        if node is None:
            break
        if last:
            return node  # type: ignore[return-value]
        scope = node.body  # type: ignore[attr-defined]
    if len(path) > 1:
        return None
    for found in ast.walk(tree):
        if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) and found.name == path[-1]:
            return found
    return None


def body_lines(func: FuncNode) -> tuple[set[int], set[int]]:
    """(first line of each statement, every line) of the body, without its docstring and
    without the bodies of functions or classes defined inside it (they run only when called)."""
    return block_lines(_without_docstring(func.body))


def script_lines(tree: ast.Module) -> tuple[set[int], set[int]]:
    """(first line of each statement, every line) that running the script executes beyond
    importing it: see the module's docstring."""
    statements: set[int] = set()
    span: set[int] = set()

    def add(lines: tuple[set[int], set[int]]) -> None:
        statements.update(lines[0])
        span.update(lines[1])

    for stmt in _without_docstring(tree.body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            add(body_lines(stmt))
        elif isinstance(stmt, ast.ClassDef):
            for member in stmt.body:
                if isinstance(member, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    add(body_lines(member))
        elif _is_main_guard(stmt):
            assert isinstance(stmt, ast.If)
            add(block_lines(stmt.body))
        else:
            add(block_lines([stmt]))
    return statements, span


def _is_main_guard(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.If) or not isinstance(stmt.test, ast.Compare):
        return False
    names = [stmt.test.left, *stmt.test.comparators]
    return any(isinstance(n, ast.Name) and n.id == "__name__" for n in names) and any(isinstance(n, ast.Constant) and n.value == "__main__" for n in names)


def _without_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        return body[1:]
    return list(body)


def block_lines(body: list[ast.stmt]) -> tuple[set[int], set[int]]:
    """(first line of each statement, every line) of `body`, without the bodies of functions
    or classes defined inside it (they run only when called)."""
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


def coverage_details(source: EntrypointSource | None, executed: set[int] | None, note: str = "") -> EntrypointCoverage | NoEntrypoint:
    if source is None:
        return NoEntrypoint(measured=False, note=note or "no entrypoint configured")
    hit = sorted(source.span & executed) if executed is not None else []
    return EntrypointCoverage(
        measured=executed is not None,
        path=source.rel,
        function=source.function,
        def_line=source.def_line,
        body_statements=len(source.statements),
        executed_statements=len(source.statements & executed) if executed is not None else None,
        executed_lines=hit[:200],
        note=note,
    )


def untested_finding(ctx: StageContext, source: EntrypointSource, executed: set[int], command: str) -> Finding | None:
    """`entrypoint-untested`: no line of the entrypoint's body ran while the suite ran.

    The seed report's KeyError shipped because no test ever called the training function;
    a smoke call catches a crash, but only a test pins down what the function should do.
    Observed (coverage of the suite's own run), medium: reported, not blocking by default.
    """
    if not source.span or source.span & executed:
        return None
    if source.script:
        code = f"the script {source.rel}'s training code (its module-level statements, `__main__` block and function bodies)"
        fix = (
            f"Add a test that runs {source.rel} in the test process on tiny arguments "
            f"(`runpy.run_path({source.rel!r}, run_name='__main__')` with `sys.argv` set, or a call of its main function) "
            "and checks its result; a script started in a subprocess is not measured."
        )
    else:
        code = f"{source.function}'s body ({source.rel})"
        fix = f"Add a test that calls {source.function} on tiny inputs (a few steps, a tiny model) and checks its result."
    return ctx.finding(
        category=ENTRYPOINT_UNTESTED,
        severity=Severity.MEDIUM,
        title=f"The test suite never executes {source.function}",
        location=Location(path=source.rel, line=source.first_line, function=None if source.script else source.function),
        problem=f"While the suite ran, none of the {len(source.statements)} statements of {code} was executed.",
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"coverage of the suite's run: 0 of {len(source.statements)} entrypoint statements executed",
            data={"path": source.rel, "body_lines": [min(source.span), max(source.span)], "executed_body_lines": [], "command": command},
        ),
        key=f"untested {source.function}",
    )
