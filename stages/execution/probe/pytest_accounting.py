"""Every test accounted for, in the pytest child: what selected it, what took it out, and what
it really did.

A passing run proves nothing if tests were quietly left out of it, or if a hook rewrote their
outcome. This plugin records, beside `EventRecorder`'s reports:

- the selection options in effect and where each came from (`addopts` of the pytest
  configuration, the gate's arguments, or neither: a conftest or plugin set it);
- every deselection and who made it (`-k`, `-m`, `--deselect`, a hook), items a hook removed
  from the collected list without saying so, paths `--ignore`/`collect_ignore` kept out, and
  modules skipped at collection;
- for every collected test: where it is, a hash of its function's source (to follow a test that
  was moved or renamed), and its skip/xfail marks, with whether the source declares them or a
  hook added them (and where, when the hook used `add_marker`);
- what each phase did, seen from outside every hook: the exception the test function itself
  raised (the function is wrapped just around the call), fixture errors, whether the function
  was called at all, and the outcome pytest's own `pytest_runtest_makereport` made before any
  wrapper could rewrite it.

The parent compares those observations with the reports pytest finally logs
(`stages/execution/accounting.py`).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
import os
import sys
import textwrap
import traceback
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import pytest
from _pytest.nodes import Node

from ...common.frames import innermost_target, is_target_file, relative
from ...contract.pytest_events import (
    CollectSkipEvent,
    DeselectedEvent,
    IgnoredEvent,
    ItemRecord,
    ItemsEvent,
    PhaseObservation,
    PytestEvent,
    SelectionEvent,
    XdistDisabledEvent,
)
from ...harness.faults import call_original

# Option destinations that narrow or stop the run, with the flag a reader knows them by.
SELECTION_OPTIONS: dict[str, str] = {
    "keyword": "-k",
    "markexpr": "-m",
    "deselect": "--deselect",
    "ignore": "--ignore",
    "ignore_glob": "--ignore-glob",
    "maxfail": "--maxfail/-x",
    "lf": "--lf",
    "failedfirst": "--ff",
    "newfirst": "--nf",
    "stepwise": "--sw",
    "collectonly": "--collect-only",
    "setuponly": "--setup-only",
    "setupplan": "--setup-plan",
    "showfixtures": "--fixtures",
    "show_fixtures_per_test": "--fixtures-per-test",
    "plugins": "-p",
}
# Plugins the gate itself turns off; not the target's choice.
_GATE_PLUGIN_OPTIONS = frozenset({"no:cacheprovider"})
# Hooks through which a conftest or plugin can take tests out or change what they report.
WATCHED_HOOKS = (
    "pytest_load_initial_conftests",
    "pytest_configure",
    "pytest_collection_modifyitems",
    "pytest_ignore_collect",
    "pytest_itemcollected",
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_runtest_teardown",
    "pytest_pyfunc_call",
    "pytest_fixture_setup",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
)
# Who calls `pytest_deselected`, by the module and function of the caller.
_DESELECTORS = {
    ("mark", "deselect_by_keyword"): "-k",
    ("mark", "deselect_by_mark"): "-m",
    ("main", "pytest_collection_modifyitems"): "--deselect",
    ("cacheprovider", ""): "--lf/--nf",
    ("stepwise", ""): "--sw",
}
_PYTEST_DIRS = (os.sep + "_pytest" + os.sep, os.sep + "pluggy" + os.sep)
MAX_MESSAGE = 500

Emit = Callable[[PytestEvent], None]


def _is_machinery(filename: str) -> bool:
    return any(part in filename for part in _PYTEST_DIRS) or filename == __file__ or filename.endswith(("pytest_plugin.py", "pytest_launcher.py"))


class TestAccountant:
    """The second plugin of the pytest child; `emit` is `EventRecorder.emit`."""

    def __init__(self, emit: Emit, root: Path) -> None:
        self.emit = emit
        self.root = root
        self._deselected: dict[str, dict[str, Any]] = {}
        self._mark_sites: dict[tuple[str, str], dict[str, Any] | None] = {}
        self._observed: dict[tuple[str, str], dict[str, Any]] = {}
        self._made: dict[tuple[str, str], str] = {}
        self._config: pytest.Config | None = None
        self._current: str | None = None
        self._phase: str | None = None
        self._watch_add_marker()

    # -- where marks come from -------------------------------------------------------------

    def _watch_add_marker(self) -> None:
        """`Node.add_marker` records its caller: a hook that marks tests skip or xfail is found
        at its line. (A hook can bypass it by editing `own_markers`; the mark is then still
        known as not declared in the source.)"""
        original = Node.add_marker
        sites = self._mark_sites
        root = self.root

        @functools.wraps(original)
        def add_marker(node: Any, marker: Any, append: bool = True) -> None:
            name = getattr(marker, "name", None) or getattr(getattr(marker, "mark", None), "name", None) or str(marker)
            if name in ("skip", "skipif", "xfail"):
                sites[(node.nodeid, name)] = _caller_site(root)
            return call_original(original, node, marker, append)

        Node.add_marker = add_marker  # type: ignore[method-assign,assignment]

    # -- what selects the run --------------------------------------------------------------

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        # Tests spread over xdist workers run where this plugin is not: the gate could see no
        # test's own outcome. It runs them in this one process instead, and says so.
        option = config.option
        if getattr(option, "tx", None) and getattr(option, "dist", "no") != "no":
            self.emit(XdistDisabledEvent(workers=len(option.tx), dist=str(option.dist)))
            option.numprocesses, option.dist, option.tx = 0, "no", []

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = session.config
        self._config = config
        addopts = [str(a) for a in config.getini("addopts")]
        self.emit(
            SelectionEvent.model_validate(
                {
                    "addopts": addopts,
                    "effective": _selection_values(config, None),
                    "from_addopts": _selection_values(config, addopts),
                    "from_args": _selection_values(config, [str(a) for a in config.invocation_params.args]),
                    "target_hooks": _target_hooks(config, self.root),
                }
            )
        )

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_ignore_collect(self, collection_path: Path, config: pytest.Config) -> Generator[None, Any, Any]:
        ignored = yield
        if ignored and collection_path.name != "__pycache__" and is_target_file(str(collection_path), self.root):
            by = _ignored_by(collection_path, config)
            if by is not None:
                self.emit(IgnoredEvent(path=relative(str(collection_path), self.root), is_dir=collection_path.is_dir(), by=by))
        return ignored

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
            path, line, reason = report.longrepr
            self.emit(CollectSkipEvent(nodeid=report.nodeid, reason=str(reason)[:MAX_MESSAGE], path=_rel(str(path), self.root), line=line if isinstance(line, int) else None))

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        by = _deselector(self.root)
        for item in items:
            self._deselected.setdefault(item.nodeid, by)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_collection_modifyitems(self, session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> Generator[None, Any, Any]:
        before = [item for item in items]
        result = yield
        kept = {id(item) for item in items}
        for item in before:
            if id(item) not in kept and item.nodeid not in self._deselected:
                # Dropped from the list without `pytest_deselected`: pytest would not even count it.
                self._deselected[item.nodeid] = {"by": "silently removed by a pytest_collection_modifyitems hook", "option": None, "site": None}
        for item in before:
            if item.nodeid in self._deselected and id(item) not in kept:
                place = {"nodeid": item.nodeid, **_item_place(item, self.root), "source_hash": _source_hash(item)}
                self.emit(DeselectedEvent.model_validate({**place, **self._deselected[item.nodeid]}))
        return result

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.emit(ItemsEvent(items=[self._describe(item) for item in session.items]))

    def _describe(self, item: pytest.Item) -> ItemRecord:
        declared = _declared_marks(item)
        marks = []
        for name in ("skip", "skipif", "xfail"):
            for mark in item.iter_markers(name):
                marks.append(
                    {
                        "name": name,
                        "reason": str(mark.kwargs.get("reason") or (mark.args[0] if name == "skip" and mark.args else "") or ""),
                        "strict": _strict(mark, self._config) if name == "xfail" else None,
                        "declared": any(mark == d for d in declared),
                        "site": self._mark_sites.get((item.nodeid, name)),
                    }
                )
        return ItemRecord.model_validate({"nodeid": item.nodeid, **_item_place(item, self.root), "source_hash": _source_hash(item), "marks": marks})

    # -- what each phase did ---------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: Any) -> None:
        self._current = nodeid

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, Any, Any]:
        return (yield from self._observe(item, "setup"))

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, Any, Any]:
        if not isinstance(item, pytest.Function) or type(item).runtest is not pytest.Function.runtest or _is_async(item.obj):
            # unittest cases, doctests, plugin items and async tests run their function their own way.
            return (yield from self._observe(item, "call"))
        original = item.obj
        item.obj = self._wrap_test_function(item.nodeid, original)
        try:
            return (yield from self._observe(item, "call", called=False))
        finally:
            item.obj = original

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
        return (yield from self._observe(item, "teardown"))

    def _observe(self, item: pytest.Item, when: str, called: bool | None = None) -> Generator[None, Any, Any]:
        record = self._observed.setdefault((item.nodeid, when), {"ran": True, "raised": None, "called": called})
        self._phase = when
        try:
            return (yield)
        except BaseException as exc:
            record["raised"] = record["raised"] or _describe_raise(exc, self.root)
            raise
        finally:
            self._phase = None

    def _wrap_test_function(self, nodeid: str, function: Any) -> Any:
        observed = self._observed
        root = self.root

        @functools.wraps(function)
        def test_function(*args: Any, **kwargs: Any) -> Any:
            record = observed.setdefault((nodeid, "call"), {"ran": True, "raised": None, "called": False})
            record["called"] = True
            try:
                return function(*args, **kwargs)
            except BaseException as exc:
                record["raised"] = _describe_raise(exc, root)
                record["raised_in_function"] = True
                raise

        return test_function

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_fixture_setup(self, fixturedef: Any, request: Any) -> Generator[None, Any, Any]:
        try:
            return (yield)
        except BaseException as exc:
            # Only a fixture the test requests itself, while its setup runs: one looked up
            # and caught by other code (`request.getfixturevalue` in a try) is that code's business.
            name = str(getattr(fixturedef, "argname", "?"))
            item = getattr(request, "_pyfuncitem", None)
            if self._phase == "setup" and self._current is not None and name in getattr(item, "fixturenames", ()):
                record = self._observed.setdefault((self._current, "setup"), {"ran": True, "raised": None, "called": None})
                record["fixture_raised"] = {"fixture": name, **_describe_raise(exc, self.root)}
            raise

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: Any) -> Generator[None, Any, Any]:
        # The innermost wrapper: the report as pytest's own implementation made it.
        report = yield
        self._made[(report.nodeid, report.when)] = report.outcome
        return report

    def phase_facts(self, report: pytest.TestReport) -> dict[str, Any]:
        """What the gate saw of this phase, for the report event (`EventRecorder` calls it)."""
        key = (report.nodeid, report.when)
        observed = self._observed.pop(key, None)
        facts: dict[str, Any] = {"observed": PhaseObservation.model_validate(observed) if observed is not None else None, "made_outcome": self._made.pop(key, None)}
        if self._config is not None and report.failed:
            try:
                status = self._config.hook.pytest_report_teststatus(report=report, config=self._config)
                facts["teststatus"] = str(status[0]) if status else None
            except Exception:  # noqa: BLE001 - a hook that fails here is the target's; the report still counts
                facts["teststatus"] = None
        return facts


# -- helpers -------------------------------------------------------------------------------


def _selection_values(config: pytest.Config, args: list[str] | None) -> dict[str, Any]:
    """The selection options that differ from their defaults: in effect (`args` None), or as
    one source of arguments alone would set them."""
    try:
        defaults = vars(config._parser.parse_known_args([]))
        values = vars(config.option) if args is None else vars(config._parser.parse_known_args(list(args)))
    except (Exception, SystemExit):  # noqa: BLE001 - an unparsable source is reported by pytest itself
        return {}
    found: dict[str, Any] = {}
    for dest in SELECTION_OPTIONS:
        value = values.get(dest)
        if dest == "plugins":
            value = [str(p) for p in value or [] if str(p).startswith("no:") and str(p) not in _GATE_PLUGIN_OPTIONS]
            if value:
                found[dest] = value
        elif value not in (None, False, [], "", 0) and value != defaults.get(dest):
            found[dest] = value if isinstance(value, (bool, int, str)) else [str(v) for v in value]
    return found


def _target_hooks(config: pytest.Config, root: Path) -> list[dict[str, Any]]:
    """The implementations of the watched hooks written in the target's own files."""
    found = []
    for name in WATCHED_HOOKS:
        caller = getattr(config.pluginmanager.hook, name, None)  # config.hook wraps some hooks in plain functions on pytest 8
        for impl in caller.get_hookimpls() if caller is not None else []:
            code = getattr(impl.function, "__code__", None)
            if code is not None and is_target_file(code.co_filename, root):
                found.append({"hook": name, "path": relative(code.co_filename, root), "line": code.co_firstlineno, "wrapper": bool(impl.wrapper or impl.hookwrapper)})
    return found


def _ignored_by(path: Path, config: pytest.Config) -> str | None:
    """Which setting kept `path` out of collection; None for pytest's own defaults."""
    def absolute(values: Any) -> list[Path]:
        return [Path(os.path.abspath(str(v))) for v in values or []]

    import fnmatch

    if path in absolute(config.getoption("ignore")):
        return "--ignore"
    if any(fnmatch.fnmatch(str(path), str(g)) for g in absolute(config.getoption("ignore_glob"))):
        return "--ignore-glob"
    if path in absolute(config._getconftest_pathlist("collect_ignore", path=path.parent)):
        return "collect_ignore in a conftest.py"
    if any(fnmatch.fnmatch(str(path), str(g)) for g in absolute(config._getconftest_pathlist("collect_ignore_glob", path=path.parent))):
        return "collect_ignore_glob in a conftest.py"
    if path.is_dir():
        if "norecursedirs" in config.inicfg and any(path.match(p) for p in config.getini("norecursedirs")):
            return "norecursedirs in the pytest configuration"
        return None  # pytest's default patterns (hidden folders, build, venvs)
    return "a pytest_ignore_collect hook"


def _deselector(root: Path) -> dict[str, Any]:
    """Who called `pytest_deselected`: an option pytest applies, or a hook of the target's."""
    frame = sys._getframe(2)
    while frame is not None and (os.sep + "pluggy" + os.sep) in frame.f_code.co_filename:
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None:
        return {"by": "unknown", "option": None, "site": None}
    filename, function = frame.f_code.co_filename, frame.f_code.co_name
    if os.sep + "_pytest" + os.sep in filename:
        module = Path(filename).stem if Path(filename).stem != "__init__" else Path(filename).parent.name
        option = _DESELECTORS.get((module, function)) or _DESELECTORS.get((module, ""))
        return {"by": option or f"pytest's {module} plugin", "option": option, "site": None}
    site = _caller_site(root, start=frame)
    return {"by": f"hook {function}" if site else f"plugin {filename}", "option": None, "site": site}


def _caller_site(root: Path, start: Any = None) -> dict[str, Any] | None:
    frame = start or sys._getframe(2)
    frames = []
    while frame is not None:
        frames.append((frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name))
        frame = frame.f_back
    return innermost_target(frames, root, innermost_first=True)


def _describe_raise(exc: BaseException, root: Path) -> dict[str, Any]:
    """The exception, its kind (skip, xfail, exit, other) and where in the target's code it came from."""
    kind = "other"
    if isinstance(exc, pytest.skip.Exception):
        kind = "skip"
    elif isinstance(exc, pytest.xfail.Exception):
        kind = "xfail"
    elif isinstance(exc, pytest.exit.Exception):
        kind = "exit"
    frames = [(f.filename, f.lineno or 0, f.name) for f in traceback.extract_tb(exc.__traceback__)]
    by_marker = bool(frames) and frames[-1][0].endswith(os.path.join("_pytest", "skipping.py"))
    site = None if by_marker else innermost_target(frames, root, innermost_first=False)
    return {"type": type(exc).__name__, "message": str(exc)[:MAX_MESSAGE], "kind": kind, "by_marker": by_marker, "site": site}


def _declared_marks(item: pytest.Item) -> list[Any]:
    """The marks the source declares for this test: decorators on the function and its class,
    `pytestmark` of the module and class, and `pytest.param(..., marks=...)`."""
    marks: list[Any] = list(getattr(getattr(item, "callspec", None), "marks", []) or [])
    for node in item.listchain():
        obj = getattr(node, "obj", None) if isinstance(node, (pytest.Module, pytest.Class, pytest.Function)) else None
        found = getattr(obj, "pytestmark", []) if obj is not None else []
        for mark in found if isinstance(found, list) else [found]:
            marks.append(getattr(mark, "mark", mark))
    return marks


def _strict(mark: Any, config: pytest.Config | None) -> bool:
    if "strict" in mark.kwargs:
        return bool(mark.kwargs["strict"])
    return bool(config.getini("xfail_strict")) if config is not None else False


def _item_place(item: pytest.Item, root: Path) -> dict[str, Any]:
    path, line, _ = item.location
    return {"path": Path(path).as_posix(), "line": (line + 1) if line is not None else None}


def _source_hash(item: pytest.Item) -> str | None:
    """The test function's body without its name and decorators, hashed (with the parameter id):
    the same test moved to another file or renamed keeps it."""
    function = getattr(item, "function", None)
    if function is None:
        return None
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    node.name, node.decorator_list = "_", []
    callspec = getattr(item, "callspec", None)
    text = ast.dump(node, annotate_fields=False) + "|" + (str(callspec.id) if callspec is not None else "")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _is_async(function: Any) -> bool:
    return inspect.iscoroutinefunction(function) or inspect.isasyncgenfunction(function)


def _rel(path: str, root: Path) -> str:
    return relative(path, root) if is_target_file(path, root) else path
