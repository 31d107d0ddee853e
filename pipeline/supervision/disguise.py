"""The gate's child-side code under names of this run only (docs/edited-tests.md).

A target could behave well only when it sees the gate: a module, an argument, an environment
variable or a path with the gate's name. So the processes that run the target's code (the
pytest child, the entrypoint harness, the warm interpreters they fork from) run a copy of the
child-side modules (`stages/harness`, `stages/contract`, every stage's `probe`) written into a
neutral temporary folder as one package of random name, each module under a random name of
its own: imports and dotted names are rewritten to the new names, the environment variables
the gate sets get random names, and every other mention of the gate's name gives way to a
random word. The gate's process and the stage agents (which never run target code) keep the
real modules; `python_argv` starts a child-side module from the copy while one is active.

Nothing here hides the instrumentation itself (see the threat model in docs/edited-tests.md).
"""

from __future__ import annotations

import ast
import compileall
import importlib.util
import re
import secrets
import shutil
import string
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

# The environment variables the gate sets in a child, under their real names.
from traingate.stages.contract.stacks import RUN_TAG_ENV as REAL_TAG_ENV, STACKS_ENV as REAL_STACKS_ENV

REAL = "traingate"
# The child-side packages: what runs inside the target's processes (import-linter keeps them
# free of the parent side).
# The child side every stage shares; each stage's own is its `probe` package, found by its
# folder (`stages/<name>/probe/`), so that no stage is named here.
SHARED_CHILD_PACKAGES = (
    "traingate.stages.harness",
    "traingate.stages.contract",
    "traingate.stages.contract.payloads",
)


def child_packages() -> tuple[str, ...]:
    """Every package of the gate whose modules run inside the target's processes."""
    spec = importlib.util.find_spec("traingate.stages")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    probes = sorted(f"traingate.stages.{init.parent.parent.name}.probe" for folder in folders for init in Path(folder).glob("*/probe/__init__.py"))
    return (*SHARED_CHILD_PACKAGES, *probes)
_IMPORT = re.compile(r"^([ \t]*)(from[ \t]+traingate[\w.]*[ \t]+import[ \t]+(?:\([^)]*\)|[^\n]*)|import[ \t]+traingate[^\n]*)", re.MULTILINE)
_DOTTED = re.compile(r"\btraingate(?:\.[A-Za-z_]\w*)*")
_MARKER = re.compile("traingate", re.IGNORECASE)


class DisguiseError(Exception):
    """The child-side modules could not be rewritten (an import form the rewrite does not know)."""


class Disguise(BaseModel):
    """Where the copy is and what every name became; handed to the stage agents as is."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    folder: str  # on sys.path of the children: holds `package`
    package: str
    modules: dict[str, str]  # real dotted module name -> its name in the copy
    stacks_env: str
    tag_env: str

    def module(self, real: str) -> str:
        """A child-side module's name in the copy; any other module's own name."""
        return self.modules.get(real, real)

    def spec(self, real: str) -> str:
        """`module:attribute` with the module's name in the copy."""
        module, sep, attr = real.partition(":")
        return self.module(module) + sep + attr


@dataclass
class _Active:
    disguise: Disguise | None = None


_active = _Active()


def active() -> Disguise | None:
    return _active.disguise


def activate(disguise: Disguise | None) -> None:
    """Children started from now on run the copy (None: the real modules again)."""
    _active.disguise = disguise


# Runs a module as __main__ without the current folder on sys.path (what `-P` does on 3.11+):
# children start in the target's root, whose own folders must never shadow traingate's modules.
_SAFE_PATH_BOOTSTRAP = "import runpy, sys; sys.path.pop(0); sys.argv[0] = sys.argv[1]; del sys.argv[1]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
# The copy's folder replaces the current one on sys.path, and the finders an editable install
# imports at start-up leave sys.modules (their objects keep serving imports).
_DISGUISED_BOOTSTRAP = (
    "import sys; sys.path[0] = {folder!r}; [sys.modules.pop(k) for k in list(sys.modules) if k.startswith('__editable__')]; "
    "import runpy; runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)
# The gate's own processes (the stage agents) run the real modules; their command line, which
# the target's processes can read as their parent's, names the module in hexadecimal.
_GATE_BOOTSTRAP = "import runpy; runpy.run_module(bytes.fromhex({module!r}).decode(), run_name='__main__', alter_sys=True)"
_argv_modules: dict[tuple[str, ...], str] = {}


def module_argv(module: str, *args: str) -> list[str]:
    """The command line that runs `module` in a fresh interpreter of this environment, with the
    target root (its cwd) off sys.path: from the copy when `module` is child-side and a
    disguise is active."""
    disguise = _active.disguise
    if disguise is not None and module in disguise.modules:
        argv = [sys.executable, "-c", _DISGUISED_BOOTSTRAP.format(folder=disguise.folder, module=disguise.module(module)), *args]
    elif disguise is not None and sys.version_info >= (3, 11):
        argv = [sys.executable, "-P", "-c", _GATE_BOOTSTRAP.format(module=module.encode().hex()), *args]
    elif sys.version_info >= (3, 11):
        argv = [sys.executable, "-P", "-m", module, *args]
    else:
        argv = [sys.executable, "-c", _SAFE_PATH_BOOTSTRAP, module, *args]
    _argv_modules[tuple(argv)] = module
    return argv


def argv_module(argv: list[str]) -> str | None:
    """The (real) module `module_argv` built `argv` for, when it did."""
    found = _argv_modules.get(tuple(argv))
    if found is None and argv and argv == module_argv(argv[-1]):
        return argv[-1]
    return found


def stacks_env(module: str | None = None) -> str:
    """The name of the stack file's variable in a child running `module` (None: a child-side one):
    the copy's while a disguise is active, the real one in the gate's own processes."""
    disguise = _active.disguise
    return disguise.stacks_env if disguise is not None and (module is None or module in disguise.modules) else REAL_STACKS_ENV


def tag_env(module: str | None = None) -> str:
    """The name of the run tag's variable in a child running `module`, as `stacks_env` chooses."""
    disguise = _active.disguise
    return disguise.tag_env if disguise is not None and (module is None or module in disguise.modules) else REAL_TAG_ENV


def tag_names() -> tuple[str, ...]:
    """Every name a run tag may have in this run's processes."""
    return (REAL_TAG_ENV,) if _active.disguise is None else (_active.disguise.tag_env, REAL_TAG_ENV)


def per_run_names() -> frozenset[str]:
    """The variables that differ between runs (their tag and stack file), under every name."""
    disguise = _active.disguise
    return frozenset({REAL_TAG_ENV, REAL_STACKS_ENV} | ({disguise.tag_env, disguise.stacks_env} if disguise is not None else set()))


def _word(length: int = 9) -> str:
    return secrets.choice(string.ascii_lowercase) + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length - 1))


def build() -> Disguise:
    """Write the copy into a new neutral temporary folder."""
    folder = Path(tempfile.mkdtemp())
    package = _word()
    sources: dict[str, Path] = {}
    for name in child_packages():
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise DisguiseError(f"{name} is not installed as a package")
        for path in sorted(Path(next(iter(spec.submodule_search_locations))).glob("*.py")):
            sources[name if path.stem == "__init__" else f"{name}.{path.stem}"] = path
    taken: set[str] = set()
    modules = {real: f"{package}.{_unique(taken)}" for real in sources}
    disguise = Disguise(folder=str(folder), package=package, modules=modules, stacks_env="_" + _word(10).upper(), tag_env="_" + _word(10).upper())
    word = _word(7)
    (folder / package).mkdir()
    (folder / package / "__init__.py").write_text("")
    try:
        for real, path in sources.items():
            text = rewrite(path.read_text(encoding="utf-8"), disguise, word)
            (folder / package / f"{modules[real].rpartition('.')[2]}.py").write_text(text, encoding="utf-8")
        # Compiled once here: each child reads them (the target's environment writes no bytecode).
        if not compileall.compile_dir(folder / package, quiet=2, workers=1):
            raise DisguiseError("the rewritten child-side modules do not compile")
    except (DisguiseError, SyntaxError, OSError):
        remove(disguise)
        raise
    return disguise


def _unique(taken: set[str]) -> str:
    while (name := _word()) in taken:
        pass
    taken.add(name)
    return name


def remove(disguise: Disguise) -> None:
    shutil.rmtree(disguise.folder, ignore_errors=True)


def rewrite(text: str, disguise: Disguise, word: str) -> str:
    """One module's source under the copy's names (line numbers kept). Import statements are
    found by their first words (parsing whole modules would cost a gate run a third of a second)."""
    text = _IMPORT.sub(lambda m: _imported(m, disguise), text)
    text = text.replace(REAL_STACKS_ENV, disguise.stacks_env).replace(REAL_TAG_ENV, disguise.tag_env)
    text = _DOTTED.sub(lambda m: _dotted(m.group(0), disguise), text)
    return _MARKER.sub(lambda m: word.upper() if m.group(0).isupper() else word, text)


def _imported(match: re.Match[str], disguise: Disguise) -> str:
    statement = match.group(2)
    try:
        node = ast.parse(statement).body[0]
    except SyntaxError:  # prose in a docstring that reads like an import
        return match.group(0)
    new = _import(node, disguise)
    return match.group(1) + new + "\n" * statement.count("\n") if new is not None else match.group(0)


def _import(node: ast.AST, disguise: Disguise) -> str | None:
    """The import statement under the copy's names; None when it imports nothing of the gate's."""
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and node.module.split(".")[0] == REAL:
        if node.module not in disguise.modules:
            raise DisguiseError(f"cannot rewrite `from {node.module} import ...`: not a child-side module")
        # A package's submodules are modules of the copy's package; anything else comes from
        # the module (or the package's __init__) itself.
        names = [(a.name, a.asname) for a in node.names]
        modules = [(n, a) for n, a in names if f"{node.module}.{n}" in disguise.modules]
        attributes = [(n, a) for n, a in names if (n, a) not in modules]
        statements = []
        if modules:
            statements.append(f"from {disguise.package} import " + ", ".join(f"{disguise.module(f'{node.module}.{n}').rpartition('.')[2]} as {a or n}" for n, a in modules))
        if attributes:
            statements.append(f"from {disguise.modules[node.module]} import " + ", ".join(f"{n} as {a}" if a else n for n, a in attributes))
        return "; ".join(statements)
    if isinstance(node, ast.Import) and any(a.name.split(".")[0] == REAL for a in node.names):
        if not all(a.asname and a.name in disguise.modules for a in node.names):
            raise DisguiseError("cannot rewrite an `import` of the gate's modules without `as`")
        return "import " + ", ".join(f"{disguise.modules[a.name]} as {a.asname}" for a in node.names)
    return None


def _dotted(name: str, disguise: Disguise) -> str:
    """A dotted name in the text: the longest module it starts with, renamed; else the package."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        head = ".".join(parts[:cut])
        if head in disguise.modules:
            return ".".join([disguise.modules[head], *parts[cut:]])
    return disguise.package
