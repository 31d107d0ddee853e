"""Shared fixtures: run traingate on a fixture target and read what it wrote."""

from __future__ import annotations

import ast
import builtins
import contextlib
import fcntl
import functools
import hashlib
import inspect
import io
import json
import linecache
import os
import shutil
import textwrap
import time
from collections.abc import Callable, Iterator
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from traingate.pipeline.gate.cli import main
from traingate.pipeline.supervision.isolation import run_child
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.pipeline.supervision import disguise, import_server, warm
from traingate.pipeline.gate.torch_probe import torch_facts
from traingate.pipeline.gate.orchestrator import run_pipeline
from traingate.pipeline.supervision.processes import ProcessInfo, become_subreaper, descendants, kill_descendants, process_table
from traingate.stages.base import run_entrypoint

from tests.markdown_tables import report_folder_problems
from tests.paths import REPO, TARGETS, suite_modules

# The installed console script, as users and CI run it (never this checkout's folders on sys.path).
TRAINGATE = [str(Path(sys.executable).with_name("traingate"))]

# One intra-op thread in the suite's processes and every process they start (the gate's children
# inherit it): two xdist workers on two cores, each child running torch's default pool of one
# thread per core, oversubscribe the cores, and the fixtures' tiny models gain nothing from a pool.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@dataclass
class GateRun:
    returncode: int
    report: dict[str, Any]
    out: Path
    stdout: str
    stderr: str

    def findings(self, category: str | None = None, stage: str | None = None) -> list[dict[str, Any]]:
        return [
            f
            for s in self.report["stages"]
            for f in s["findings"]
            if (category is None or f["category"] == category) and (stage is None or f["stage"] == stage)
        ]

    def categories(self, stage: str | None = None) -> set[str]:
        return {f["category"] for f in self.findings(stage=stage)}

    def stage(self, name: str) -> dict[str, Any]:
        return next(s for s in self.report["stages"] if s["name"] == name)


def line_of(path: Path, text: str) -> int:
    """1-based number of the one line of `path` that holds `text` (expected lines are found,
    never hard-coded, so fixtures can change without silently moving what a test checks)."""
    lines = path.read_text().splitlines()
    [number] = [i for i, line in enumerate(lines, start=1) if text in line]
    return number


# A test that starts the traingate command line (a gate run costs seconds), a stage agent or
# the target's code in a child process is marked `slow` at collection: its function, the
# fixtures it uses and the test helpers they call are read, and any of them that calls
# `start_cli` (`run_gate`, the `gate` fixture, ...), `run_pipeline`, `run_entrypoint` or
# `run_child`, names TRAINGATE or starts `sys.executable`, counts. A CLI started from a test that is not marked fails the test (see `start_cli`), so
# the reading cannot miss one silently.
_current: list[pytest.Item] = []
_reaches: dict[Any, bool] = {}
# The gate's own entry points that start stage agents or the target's code in children.
_STARTS_TARGET = {run_entrypoint, run_child, run_pipeline}
# Followed: the tests' helpers and the gate's own functions they call (an editable install).
_OWN_CODE = tuple(str(REPO / folder) + os.sep for folder in ("tests", "pipeline", "stages", "reports"))


def _source_tree(code: Any) -> ast.AST:
    """The parsed source of a function's code, as `inspect.getsource` finds it, without the
    module lookup it makes per call (a search of every loaded module: torch's thousands)."""
    lines = linecache.getlines(code.co_filename)
    return ast.parse(textwrap.dedent("".join(inspect.getblock(lines[code.co_firstlineno - 1 :]))))


def _starts_cli(function: Any) -> bool:
    """Whether `function` (a test, a fixture, a helper, a function of the gate's) calls one of
    the entry points above, directly or through the functions it names."""
    if function is start_cli or any(function is entry for entry in _STARTS_TARGET):
        return True
    code = getattr(function, "__code__", None)
    if code is None or not code.co_filename.startswith(_OWN_CODE):
        return False
    known = _reaches.get(code)
    if known is not None:
        return known
    _reaches[code] = False  # recursion guard
    try:
        tree = _source_tree(code)
    except (OSError, TypeError, SyntaxError):
        return False
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} - {code.co_name}
    scope = {**vars(builtins), **function.__globals__, **inspect.getclosurevars(function).nonlocals}
    # A Python child of its own (`subprocess.run([sys.executable, ...])`) counts too.
    interpreter = any(isinstance(n, ast.Attribute) and n.attr == "executable" and isinstance(n.value, ast.Name) and n.value.id == "sys" for n in ast.walk(tree))
    found = "TRAINGATE" in names or (interpreter and "subprocess" in names) or any(_starts_cli(scope[name]) for name in names if callable(scope.get(name)))
    _reaches[code] = found
    return found


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        function = getattr(item, "function", None)
        info = getattr(item, "_fixtureinfo", None)
        fixtures = [d.func for defs in (info.name2fixturedefs.values() if info else ()) for d in defs]
        if any(_starts_cli(f) for f in [function, *fixtures] if f is not None):
            item.add_marker(pytest.mark.slow)
    _longest_modules_first(items)


def _longest_modules_first(items: list[pytest.Item]) -> None:
    """The modules that one worker runs whole (`_one_worker_modules`) first, then the others
    with the most slow tests first, the in-process ones last; each module's tests together and
    in their order (a module's fixtures are set up once). With `-n`, a worker that finishes
    its long tests early picks up short ones, and the workers end together."""
    first: dict[str, int] = {}
    slow: dict[str, int] = {}
    for index, item in enumerate(items):
        module = item.nodeid.split("::")[0]
        first.setdefault(module, index)
        slow[module] = slow.get(module, 0) + (item.get_closest_marker("slow") is not None)
    whole = _one_worker_modules()

    def order(item: pytest.Item) -> tuple[bool, int, int]:
        module = item.nodeid.split("::")[0]
        return (not (module in whole and slow[module]), -slow[module], first[module])

    items.sort(key=order)


@functools.lru_cache(maxsize=1)
def _one_worker_modules() -> frozenset[str]:
    """Test modules (as node ids name them) that define a fixture of module scope. (A test
    module's session fixtures are made once for all workers, under a file lock, as
    `shared_gate` is: their tests may go to any worker.)"""
    found = set()
    for path in suite_modules():
        text = path.read_text(encoding="utf-8")
        if "scope=" not in text:  # parsed only where a fixture may have a scope
            continue
        for node in ast.walk(ast.parse(text)):
            decorators = node.decorator_list if isinstance(node, ast.FunctionDef) else []
            keywords = [k for d in decorators if isinstance(d, ast.Call) for k in d.keywords]
            if any(k.arg == "scope" and isinstance(k.value, ast.Constant) and k.value.value == "module" for k in keywords):
                found.add(path.relative_to(REPO).as_posix())
    return frozenset(found)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`-n N`: tests go to the workers one at a time, as xdist's `load` does, except that a
    module with a fixture of its own module or session scope (a gate run its tests share) goes
    to one worker whole; split over two workers, each would make that run again. (xdist's
    `--dist loadgroup` would do it from marks, but it renames node ids through an attribute
    pytest 9 no longer has.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    grouped = _one_worker_modules()

    class ModuleFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return module if module in grouped else target_scope(nodeid)

    return ModuleFixtureScheduling(config, log)


# -- Tests that read the same fixture target go to one worker -------------------------------
# Two workers asking for the same `shared_gate` run at once: one makes it, the other waits on
# the lock, idle. Tests that name the same fixture target (a string constant in the test
# function, or a parameter of its node id) are one unit of xdist's schedule instead.
def target_scope(nodeid: str) -> str:
    """The scheduling unit of a test: `target:NAME` for a test that reads fixture target NAME,
    else the test alone."""
    names = _fixture_target_names()
    function, _, params = nodeid.partition("[")
    named = [p for p in params.rstrip("]").split("-") if p in names] if params else []
    target = named[0] if named else _target_named_in_test().get(function)
    return f"target:{target}" if target else nodeid


@functools.lru_cache(maxsize=1)
def _fixture_target_names() -> frozenset[str]:
    return frozenset(p.name for p in TARGETS.iterdir() if p.is_dir())


@functools.lru_cache(maxsize=1)
def _target_named_in_test() -> dict[str, str]:
    """`tests/test_x.py::test_y` -> the first fixture target name that test_y, or else a
    fixture of its module it asks for, spells as a string."""
    names = _fixture_target_names()
    found: dict[str, str] = {}
    for path in suite_modules():
        module = path.relative_to(REPO).as_posix()
        functions = [node for node in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(node, ast.FunctionDef)]
        spelt = {f.name: [n.value for n in ast.walk(f) if isinstance(n, ast.Constant) and n.value in names] for f in functions}
        for test in (f for f in functions if f.name.startswith("test_")):
            named = spelt[test.name] + [t for a in test.args.args for t in spelt.get(a.arg, [])]
            if named:
                found[f"{module}::{test.name}"] = named[0]
    return found


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _current[:] = [item]


def start_cli(args: list[str], *, cwd: Path = REPO, timeout: float = 600, env: dict[str, str] | None = None, **options: Any) -> subprocess.CompletedProcess[str]:
    """`traingate ARGS` in a subprocess, as a CI job runs it, from a test marked slow."""
    if _current and _current[0].get_closest_marker("slow") is None:
        pytest.fail(f"{_current[0].nodeid} starts the traingate CLI but was not marked slow: call it through start_cli, run_gate or the gate fixture")
    started, children = time.monotonic(), _children_cpu()
    done = subprocess.run([*TRAINGATE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd, env=cli_env(env), **options)
    if RUN_LOG:
        note_cli_run(args, time.monotonic() - started, _children_cpu() - children, done.returncode)
    return done


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `traingate` process a test starts: `env` (or this process's), less
    what would reach the real CI job or policy, and no pytest plugin autoloaded in the target."""
    # When this suite itself runs in GitHub Actions, the runs it makes must not annotate the
    # real job or append to its step summary.
    base = env if env is not None else dict(os.environ)
    clean = {k: v for k, v in base.items() if k not in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "TRAINGATE_POLICY")}
    # The fixture targets' suites need no pytest plugin of this environment; the dev extras'
    # hypothesis plugin imports hypothesis at every run's summary (0.8 s of each target suite).
    clean.setdefault("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    return clean


def cli_in_process(*args: str) -> subprocess.CompletedProcess[str]:
    """`traingate ARGS` run in this process, output captured: for the commands that start no
    stage (schema, explain, history, merge, --help). Milliseconds instead of a second's
    interpreter start, so these tests stay out of the slow set."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: Any = main(list(args))
        except SystemExit as stop:
            code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 2)
    return subprocess.CompletedProcess(["traingate", *args], int(code), out.getvalue(), err.getvalue())


def run_gate(target: Path, out: Path, *args: str, timeout: float = 600) -> GateRun:
    """Run `traingate run` exactly as a CI job would, in a subprocess."""
    done = start_cli(["run", str(target), "--out", str(out), *args], timeout=timeout)
    # Every report the suite's gate runs write: target text (exception messages, test names,
    # paths) never breaks a table row or a title (tests/markdown_tables.py).
    broken = report_folder_problems(out)
    assert not broken, "\n".join(broken)
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    return GateRun(done.returncode, report, out, done.stdout, done.stderr)


@pytest.fixture
def gate(shared_gate: Callable[..., tuple[GateRun, float]], tmp_path: Path) -> Callable[..., GateRun]:
    """gate("case_name", "--stages", "execution"): the session's one run of traingate on the
    unmodified tests/targets/case_name with those arguments (`shared_gate`); gate(path, ...):
    a run of its own on a target the test built or edited (a copy), written under tmp_path."""

    def _run(case: str | Path, *args: str, timeout: float = 600) -> GateRun:
        if isinstance(case, Path):
            return run_gate(case, tmp_path / "out", *args, timeout=timeout)
        return shared_gate(case, *args, timeout=timeout)[0]

    return _run


# -- One gate run per fixture target and arguments ------------------------------------------
# Fixture targets that tests read for different stages: `shared_gate` widens a request for
# any of these stages alone to one run with all of them, so the target runs once. A test
# reading a widened run looks at its own stage (`run.stage`, `run.findings(stage=...)`), or
# its assertions hold for the union too.
STAGES_READ_TOGETHER = {"conc_clean_amp": "concurrency,correctness", "conc_no_entrypoint": "concurrency,correctness"}


def shared_gate_args(case: str, args: tuple[str, ...]) -> tuple[str, ...]:
    """`args` as the shared run is made: `--stages S` widened to STAGES_READ_TOGETHER's set
    for the target where S is part of it."""
    together = STAGES_READ_TOGETHER.get(case)
    if together is None or len(args) != 2 or args[0] != "--stages":
        return args
    asked, union = set(args[1].split(",")), together.split(",")
    return ("--stages", together) if asked <= set(union) else args


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this session sees (the session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def gate_once(shared: Path, name: str, make: Callable[[Path], GateRun]) -> tuple[GateRun, float]:
    """make(out) once per session and name, whichever worker asks first (a file lock in
    `shared`); every caller gets the run read back from `out`, and the wall time it took."""
    out, done = shared / f"gate-{name}", shared / f"gate-{name}.json"
    with open(shared / f"gate-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not done.is_file():
            started = time.monotonic()
            gate = make(out)
            wall = time.monotonic() - started
            done.write_text(json.dumps({"returncode": gate.returncode, "stdout": gate.stdout, "stderr": gate.stderr, "wall": wall}))
    saved = json.loads(done.read_text())
    report_path = out / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    return GateRun(saved["returncode"], report, out, saved["stdout"], saved["stderr"]), saved["wall"]


@pytest.fixture(scope="session")
def shared_gate(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[GateRun, float]]:
    """shared_gate("case", "--stages", "performance") runs traingate on tests/targets/case once
    for the whole test session, whichever worker asks first (`gate_once`), and hands every
    test that asks the same run and its wall time: one gate run per fixture target and
    arguments, shared by the assertions that read it."""
    shared = shared_folder(tmp_path_factory)

    def run(case: str, *args: str, timeout: float = 600) -> tuple[GateRun, float]:
        args = shared_gate_args(case, args)
        name = "-".join([case, *(a.strip("-").replace("/", "_") for a in args)])
        return gate_once(shared, name, lambda out: run_gate(TARGETS / case, out, *args, timeout=timeout))

    return run


# The session's temporary folders (tmp_path) go to memory where the machine has room for them:
# a suite run creates about 12,000 files there (the gate runs' out folders, copied targets),
# each about 0.7 ms on the disk-backed /tmp of a CI machine. Set in the process that names
# them: with xdist, the controller, which hands each worker its folder, so the workers and
# the gate's processes keep their defaults, which are what the suite tests (without xdist the
# one process's own temporary files go there too). TMPDIR, TEMP, TMP or --basetemp still choose.
SUITE_MEMORY_ROOM = 1 << 30


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput") or config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT") or disguise.temporary_folder_chosen():
        return
    folder = disguise.memory_folder(SUITE_MEMORY_ROOM)
    if folder is not None:
        tempfile.tempdir = folder


def pytest_sessionstart(session: pytest.Session) -> None:
    # Whatever a test starts, however it detaches (setsid, double fork), stays a descendant of
    # this process, so the check below sees it instead of init adopting it.
    become_subreaper()


# The open `warm_pool` fixtures: their interpreters are kept between the tests of a module.
_open_pools: list[WarmPool] = []


@pytest.fixture(scope="module")
def warm_pool(tmp_path_factory: pytest.TempPathFactory):
    """A warm pool for the entrypoint runs a module's tests make themselves, as a stage agent
    has one for its runs: the runs fork from an interpreter that imported torch once."""
    if not warm.enabled():
        yield None
        return
    pool = WarmPool(tmp_path_factory.mktemp("warm"))
    _open_pools.append(pool)
    try:
        yield pool
    finally:
        _open_pools.remove(pool)
        pool.close()


# The import server of this worker (`import_server`), when it runs: kept between tests.
_servers: list[subprocess.Popen[bytes]] = []


@pytest.fixture(scope="session", autouse=True)
def shared_torch_import():
    """One import server per worker (`pipeline/supervision/import_server.py`): the agents' host
    of every gate run a test starts through `start_cli` is a fork of it, and the `traingate`
    process a fork of its gate server, so the suite pays `import torch` and the command line's
    imports once per worker instead of once per gate run. TRAINGATE_SUITE_IMPORT_SERVER=0
    leaves it out (every run then starts afresh, as a CI job's does)."""
    with serving_this_environment():
        yield


@contextlib.contextmanager
def serving_this_environment() -> Iterator[None]:
    """An import server for the gate runs started in this process's environment as it is now,
    named in it until the block ends (a module that sets PYTHONPATH for all its runs has its own:
    the worker's refuses them, as their interpreters start otherwise)."""
    if os.environ.get("TRAINGATE_SUITE_IMPORT_SERVER", "1") == "0" or not warm.enabled():
        yield
        return
    # A short folder of its own: a Unix socket's path has at most 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="tg-import-"))
    socket_path = folder / "socket"
    device = "cuda" if torch_facts().cuda else "cpu"
    server = import_server.start(socket_path, cli_env({**os.environ, import_server.SERVER_ENV: str(socket_path)}), device)
    _servers.append(server)
    # Served from the first run on: a run made before the server is up would start its host
    # afresh, or none at all for a suite alone (`agent_host`), whichever test happens to be first.
    import_server.wait_ready(socket_path, server)
    before = os.environ.get(import_server.SERVER_ENV)
    os.environ[import_server.SERVER_ENV] = str(socket_path)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(import_server.SERVER_ENV, None)
        else:
            os.environ[import_server.SERVER_ENV] = before
        _servers.remove(server)
        import_server.stop(server)
        shutil.rmtree(folder, ignore_errors=True)


def _kept(process: ProcessInfo) -> bool:
    return any(process.pid == w.pid for pool in _open_pools for w in pool.interpreters()) or _a_server(process)


def _a_server(process: ProcessInfo) -> bool:
    """One of the servers of this worker's import servers (the import server, its gate server,
    its siblings: each names its socket, and none leads a session, as every fork they serve does)."""
    return process.sid != process.pid and any(str(Path(s.args[-1])) in process.cmdline for s in _servers if isinstance(s.args, list) and s.args)


def _kept_below(resident: set[int]) -> Callable[[ProcessInfo], bool]:
    """What a leftover sweep below a server passes over: the servers themselves."""
    return lambda process: process.pid in resident or _a_server(process)


def _anything_left(table: dict[int, ProcessInfo]) -> bool:
    """Whether a process of this test's still runs below this process or below the servers, or
    an orphan handed to this process (a subreaper) waits to be reaped."""
    me = os.getpid()
    if any(p.alive or p.ppid == me for p in descendants(me, table, skip=_kept)):
        return True
    for server in _servers:
        resident = import_server.residents(server.pid, table)
        if any(p.alive for pid in resident for p in descendants(pid, table, skip=_kept_below(resident))):
            return True
    return False


@pytest.fixture(autouse=True)
def no_process_left_behind():
    """Every test ends with no process of its own still running: the gate kills what the
    target starts, and the tests kill what they start (the import server's hosts included:
    each gate run has its own killed before it ends). One /proc scan when nothing is left."""
    yield
    if not _anything_left(process_table(cmdlines=False)):
        return
    left = [p for p in kill_descendants(skip=_kept) if p.alive]
    for server in _servers:
        resident = import_server.residents(server.pid)
        left += [p for pid in resident for p in kill_descendants(pid, skip=_kept_below(resident)) if p.alive]
    if left:
        listing = "; ".join(f"pid {p.pid} (parent {p.ppid}, sid {p.sid}) {p.cmdline[:300]}" for p in left)
        pytest.fail(f"{len(left)} process(es) left running after the test (now killed): {listing}")



# -- The suite's own runs, listed on request ------------------------------------------------
# TRAINGATE_SUITE_RUNS=FILE: every `traingate` command a test starts through `start_cli` (a gate
# run, shared or its own, or another command) is one JSON line appended to FILE: the test, the
# command, a digest of the target's files and of each file argument's content, the wall time
# and the children's CPU. `benchmarks/suite_runs.py FILE` counts them and names the runs made
# more than once (same content, same arguments), which a shared run could serve.
RUN_LOG = os.environ.get("TRAINGATE_SUITE_RUNS")
_SKIPPED_IN_DIGEST = {"__pycache__", ".pytest_cache", ".hypothesis"}


def _children_cpu() -> float:
    times = os.times()
    return times.children_user + times.children_system


def content_digest(path: Path) -> str:
    """A digest of what a file or a folder's files hold (their paths relative to it and their
    bytes), so two copies of one target are known to be the same."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and not _SKIPPED_IN_DIGEST & set(p.relative_to(path).parts))
    for file in files:
        with contextlib.suppress(OSError):
            digest.update(file.relative_to(path).as_posix().encode() if file != path else b"")
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def _described(args: list[str]) -> tuple[str | None, list[str]]:
    """The target named by `run TARGET` (a fixture's name or `copy:NAME`) and the arguments,
    each path replaced by its content's digest (an --out folder by `OUT`)."""
    target = None
    shown = []
    for index, arg in enumerate(args):
        path = Path(arg)
        if index and args[index - 1] == "--out":
            shown.append("OUT")
        elif index == 1 and args[0] == "run":
            target = path.name if path.parent == TARGETS else f"copy:{path.name}"
            shown.append(f"@{content_digest(path)}" if path.exists() else arg)
        elif path.is_absolute() and path.exists():
            shown.append(f"@{content_digest(path)}")
        else:
            shown.append(arg)
    return target, shown


def note_cli_run(args: list[str], wall: float, cpu: float, returncode: int) -> None:
    target, shown = _described(args)
    record = {"test": _current[0].nodeid if _current else None, "worker": os.environ.get("PYTEST_XDIST_WORKER"), "target": target, "args": shown, "wall_s": round(wall, 2), "children_cpu_s": round(cpu, 2), "returncode": returncode}
    assert RUN_LOG is not None
    with open(RUN_LOG, "a", encoding="utf-8") as log:
        fcntl.flock(log, fcntl.LOCK_EX)
        log.write(json.dumps(record) + "\n")
