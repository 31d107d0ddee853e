"""The gate's child-side modules under a name of this run only (docs/edited-tests.md).

A target could behave well only when it sees the gate: a module, an argument, an environment
variable or a path with the gate's name. So the processes that run the target's code (the
pytest child, the entrypoint harness, the warm interpreters they are forked from) run a copy of
the child-side packages (`stages/common`, `stages/contract`, `stages/harness`, every stage's
`probe`), written into a neutral temporary folder as one package of random name, laid out as
under `stages/`. The copy is a plain copy of the files: their modules import one another
relatively and never mention the gate (`.ci/lint` keeps them so), and they name the two
environment variables the gate sets after the package they run as (`stages/common/stacks.py`),
so those get random names too. The gate's process and the stage agents (which never run target
code) keep the installed modules.

Which copy a child starts from travels with it: the `Disguise` is handed to each stage agent in
its request and to every command that starts a child (`isolation.python_argv(..., disguise=)`).

Nothing here hides the instrumentation itself (see the threat model in docs/edited-tests.md).
"""

from __future__ import annotations

import fcntl
import importlib.util
import marshal
import os
import py_compile
import secrets
import shutil
import string
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from types import CodeType

from pydantic import BaseModel, ConfigDict

from traingate.stages.common.stacks import RUN_TAG_ENV, STACKS_ENV, run_tag_env_of, stacks_env_of

# The installed package the child side lives in; the copy stands in for it.
STAGES = "traingate.stages"
# The child side every stage shares; each stage's own is its `probe` package, found by its
# folder (`stages/<name>/probe/`), so that no stage is named here.
SHARED_CHILD_PACKAGES = (f"{STAGES}.common", f"{STAGES}.contract", f"{STAGES}.harness")


def child_packages() -> tuple[str, ...]:
    """Every package of the gate whose modules run inside the target's processes (subpackages
    are copied with them)."""
    probes = sorted(f"{STAGES}.{init.parent.parent.name}.probe" for init in _stages_folder().glob("*/probe/__init__.py"))
    return (*SHARED_CHILD_PACKAGES, *probes)


def _stages_folder() -> Path:
    spec = importlib.util.find_spec(STAGES)
    if spec is None or not spec.submodule_search_locations:
        raise DisguiseError(f"{STAGES} is not installed as a package")
    return Path(next(iter(spec.submodule_search_locations)))


class DisguiseError(Exception):
    """The child-side modules could not be copied."""


class Disguise(BaseModel):
    """Where the copy is and under which package name; handed to the stage agents as is."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    folder: str  # on sys.path of the children: holds `package`
    package: str
    packages: tuple[str, ...]  # the child-side packages copied, by their installed names

    def holds(self, real: str) -> bool:
        """Whether the module `real` (its installed name) is child-side: a module of the copy."""
        return any(real == name or real.startswith(name + ".") for name in self.packages)

    def module(self, real: str) -> str:
        """A child-side module's name in the copy; any other module's own name."""
        return self.package + real[len(STAGES):] if self.holds(real) else real

    def spec(self, real: str) -> str:
        """`module:attribute` with the module's name in the copy."""
        module, sep, attr = real.partition(":")
        return self.module(module) + sep + attr

    @property
    def stacks_env(self) -> str:
        """The stack file's variable in a child that runs the copy."""
        return stacks_env_of(self.package)

    @property
    def tag_env(self) -> str:
        """The run tag's variable in a child that runs the copy."""
        return run_tag_env_of(self.package)


def stacks_env(module: str, disguise: Disguise | None) -> str:
    """The name of the stack file's variable in a child running `module`: the copy's for a
    child-side module under a disguise, the installed one's in the gate's own processes."""
    return disguise.stacks_env if disguise is not None and disguise.holds(module) else STACKS_ENV


def tag_env(module: str, disguise: Disguise | None) -> str:
    """The name of the run tag's variable in a child running `module`, as `stacks_env` chooses."""
    return disguise.tag_env if disguise is not None and disguise.holds(module) else RUN_TAG_ENV


def tag_names(disguise: Disguise | None) -> tuple[str, ...]:
    """Every name a run tag may have in the processes of a run under `disguise`."""
    return (RUN_TAG_ENV,) if disguise is None else (disguise.tag_env, RUN_TAG_ENV)


def per_run_names(disguise: Disguise | None) -> frozenset[str]:
    """The variables that differ between runs (their tag and stack file), under every name."""
    return frozenset({RUN_TAG_ENV, STACKS_ENV} | ({disguise.tag_env, disguise.stacks_env} if disguise is not None else set()))


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


def module_argv(module: str, *args: str, disguise: Disguise | None = None) -> list[str]:
    """The command line that runs `module` in a fresh interpreter of this environment, with the
    target root (its cwd) off sys.path: from the copy when `module` is child-side and a
    disguise is given."""
    if disguise is not None and disguise.holds(module):
        return [sys.executable, "-c", _DISGUISED_BOOTSTRAP.format(folder=disguise.folder, module=disguise.module(module)), *args]
    if disguise is not None and sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-c", _GATE_BOOTSTRAP.format(module=module.encode().hex()), *args]
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *args]
    return [sys.executable, "-c", _SAFE_PATH_BOOTSTRAP, module, *args]


# Where the copy goes when no temporary folder is chosen (TMPDIR, TEMP, TMP): a folder in memory
# with room for it. The copy is about 150 small files a run; creating one costs about 0.7 ms on
# the disk-backed /tmp of a CI machine and 0.03 ms on tmpfs (this 2-core VM), so about a tenth
# of a second of every gate run.
MEMORY_FOLDERS = ("/dev/shm",)
MEMORY_ROOM = 64 << 20  # free bytes a memory folder must have (the copy takes 1.5 MB)


def copy_parent(env: Mapping[str, str] = os.environ) -> str | None:
    """The folder the copy's temporary folder is made in: a memory folder with room, unless a
    temporary folder is chosen; None for the default temporary folder."""
    return None if temporary_folder_chosen(env) else memory_folder(MEMORY_ROOM)


def temporary_folder_chosen(env: Mapping[str, str] = os.environ) -> bool:
    """Whether `env` names a temporary folder, as `tempfile` reads one."""
    return any(env.get(name) for name in ("TMPDIR", "TEMP", "TMP"))


def memory_folder(room: int) -> str | None:
    """The first of MEMORY_FOLDERS this process may write to with `room` bytes free, if any."""
    for folder in MEMORY_FOLDERS:
        try:
            free = os.statvfs(folder)
        except OSError:
            continue
        if free.f_bavail * free.f_frsize >= room and os.access(folder, os.W_OK | os.X_OK):
            return folder
    return None


def _word(length: int = 9) -> str:
    return secrets.choice(string.ascii_lowercase) + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(length - 1))


def build() -> Disguise:
    """Copy the child-side packages into a new neutral temporary folder, under a random name.
    In a memory folder, the copies of runs that were killed outright go first (`sweep`)."""
    stages = _stages_folder()
    packages = child_packages()
    parent = copy_parent()
    if parent is not None:
        sweep(Path(parent))
    folder = Path(tempfile.mkdtemp(dir=parent))
    held = _hold(folder)  # a new folder, nobody else's; locked before anything is copied: a sweep passes over an empty folder
    if held is not None:
        _held[str(folder)] = held
    disguise = Disguise(folder=str(folder), package=_word(), packages=packages)
    copy = folder / disguise.package
    try:
        for name in packages:
            relative = Path(*name[len(STAGES) + 1:].split("."))
            shutil.copytree(stages / relative, copy / relative, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # The packages between (the copy's own, a stage's) are empty: the stages' parent side stays out.
        for package in {copy, *(p.parent for p in copy.glob("*/probe"))}:
            (package / "__init__.py").write_text("")
        # Compiled once here: each child reads them (the target's environment writes no bytecode).
        compile_copy(copy, stages)
    except (DisguiseError, OSError):
        remove(disguise)
        raise
    return disguise


def compile_copy(copy: Path, stages: Path) -> None:
    """Bytecode beside every module of `copy` (laid out as `stages`): the installed module's
    own where it is current for the file copied (the copy keeps its source's time and size,
    which the bytecode's header records), with its code's file name made the copy's, as
    compiling the copy would have written it (the installed path names the gate); else
    compiled here. A third of a second of every run's start-up is the compiling saved."""
    for source in copy.rglob("*.py"):
        cached = Path(importlib.util.cache_from_source(str(source)))
        installed = _current_bytecode(Path(importlib.util.cache_from_source(str(stages / source.relative_to(copy)))), source)
        if installed is not None:
            cached.parent.mkdir(exist_ok=True)
            cached.write_bytes(installed[:16] + marshal.dumps(_renamed(marshal.loads(installed[16:]), str(source))))
            continue
        try:
            py_compile.compile(str(source), cfile=str(cached), doraise=True)
        except py_compile.PyCompileError as exc:
            raise DisguiseError(f"the copied child-side modules do not compile: {exc.msg}") from exc


def _renamed(code: CodeType, filename: str) -> CodeType:
    """`code` and every code object inside it, with `filename` as their file name."""
    consts = tuple(_renamed(const, filename) if isinstance(const, CodeType) else const for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _current_bytecode(cached: Path, source: Path) -> bytes | None:
    """The bytecode file `cached`, when this interpreter wrote it from a source of `source`'s
    time and size (a timestamp-checked one); None otherwise."""
    try:
        data = cached.read_bytes()
    except OSError:
        return None
    stat = source.stat()
    header = (importlib.util.MAGIC_NUMBER, 0, int(stat.st_mtime) & 0xFFFFFFFF, stat.st_size & 0xFFFFFFFF)
    fields = (data[:4], *(int.from_bytes(data[at : at + 4], "little") for at in (4, 8, 12)))
    return data if len(data) > 16 and fields == header else None


def remove(disguise: Disguise) -> None:
    shutil.rmtree(disguise.folder, ignore_errors=True)
    held = _held.pop(disguise.folder, None)
    if held is not None:
        os.close(held)


# A copy is held, for as long as its run lasts, by a lock on its folder that the process which
# built it keeps (`_hold`): the kernel drops the lock when that process dies, however it dies. A
# run killed outright (SIGKILL: its caller died, the job was cancelled) removes nothing, and a
# copy in memory would keep its 1.5 MB until the machine restarts.
_held: dict[str, int] = {}


def _hold(folder: str | Path) -> int | None:
    """An open descriptor of `folder` with an exclusive lock on it (not inherited by children);
    None where another process holds the lock or the folder cannot be locked (a filesystem
    without `flock`: no sweep can lock it either, so none removes it)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(descriptor)
        return None
    return descriptor


def sweep(parent: Path) -> list[str]:
    """Remove the copies under `parent` that no live process holds; the folders removed. Only a
    folder laid out as a copy is looked at (`_laid_out_as_copy`), and only one whose lock can be
    taken is removed, under that lock."""
    removed: list[str] = []
    try:
        entries = [e for e in os.scandir(parent) if e.name.startswith("tmp") and e.is_dir(follow_symlinks=False)]
    except OSError:
        return removed
    for entry in entries:
        if not _laid_out_as_copy(Path(entry.path)):
            continue
        descriptor = _hold(entry.path)
        if descriptor is None:  # held: its run goes on
            continue
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
        finally:
            os.close(descriptor)
    return removed


def _laid_out_as_copy(folder: Path) -> bool:
    """One package of the copy's layout, beside nothing but hidden files (the stack files
    `isolation` writes there)."""
    try:
        inside = [p for p in folder.iterdir() if not p.name.startswith(".")]
    except OSError:
        return False
    shared = (name.rpartition(".")[2] for name in SHARED_CHILD_PACKAGES)
    return len(inside) == 1 and inside[0].is_dir() and all((inside[0] / name).is_dir() for name in shared)
