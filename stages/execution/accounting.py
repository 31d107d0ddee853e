"""Every test accounted for: one record per test of the run, including the tests that did not
run (deselected, kept out of collection, skipped at collection), and how each was taken out.

Pure: reads the plugin's events as `SuiteResult` has folded them and the target's tree; the
findings built from these records live in `accounting_checks`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from traingate.pipeline.model.schema import Location, TakenOut, TestRecord
from traingate.stages.contract.messages import TargetFrame
from traingate.stages.contract.pytest_events import (
    DeselectedEvent,
    IgnoredEvent,
    ItemRecord,
    OptionValue,
    RaisedException,
    SelectionEvent,
    SkipSite,
    TargetHook,
)
from traingate.stages.execution.suite import SuiteResult, TestOutcome, skip_reason

# Options by destination, as a reader writes them.
_FLAGS = {
    "keyword": "-k", "markexpr": "-m", "deselect": "--deselect", "ignore": "--ignore", "ignore_glob": "--ignore-glob",
    "maxfail": "--maxfail", "lf": "--lf", "failedfirst": "--ff", "newfirst": "--nf", "stepwise": "--sw",
    "collectonly": "--collect-only", "setuponly": "--setup-only", "setupplan": "--setup-plan",
    "showfixtures": "--fixtures", "show_fixtures_per_test": "--fixtures-per-test", "plugins": "-p",
}
# Deselection reasons `pytest_accounting` reports, by the option's destination.
_DESELECTED_BY = {"-k": "keyword", "-m": "markexpr", "--deselect": "deselect", "--lf/--nf": "lf", "--sw": "stepwise"}
_IGNORED_BY = {"--ignore": "ignore", "--ignore-glob": "ignore_glob"}
TEST_FILE = re.compile(r"^(test_.*|.*_test)\.py$")
# Folders no one keeps a suite in: pytest's own default `norecursedirs` and the usual tool caches.
_NOT_SOURCE = {".git", ".hg", ".svn", ".tox", ".nox", ".venv", "venv", "env", "node_modules", "build", "dist", "__pycache__", "site-packages", ".eggs"}


class Selection:
    """The selection options in effect, and where each came from."""

    def __init__(self, event: SelectionEvent | None, root: Path, config_file: str | None) -> None:
        # No event: the plugin never reported the selection (pytest ended before its session).
        self.effective: dict[str, OptionValue] = event.effective if event is not None else {}
        self._from_addopts: dict[str, OptionValue] = event.from_addopts if event is not None else {}
        self._from_args: dict[str, OptionValue] = event.from_args if event is not None else {}
        self.target_hooks: list[TargetHook] = event.target_hooks if event is not None else []
        self._root = root
        self._config_file = config_file

    def describe(self, dest: str) -> str:
        """`-k 'not slow'`, `--deselect a --deselect b`, `-p no:warnings`, for an option in effect."""
        value, flag = self.effective[dest], _FLAGS.get(dest, dest)
        if dest == "maxfail":
            return "-x" if value == 1 else f"--maxfail={value}"
        if isinstance(value, bool):
            return flag
        if isinstance(value, list):
            return " ".join(f"{flag} {shlex.quote(str(v))}" for v in value)
        return f"{flag} {shlex.quote(str(value))}"

    def source(self, dest: str) -> tuple[str, Location | None]:
        """Where the option came from, in words, and the line that sets it when known."""
        if dest in self._from_addopts and self._config_file:
            return f"`addopts` in {self._config_file}", Location(path=self._config_file, line=_line_with(self._root / self._config_file, "addopts"))
        if dest in self._from_args:
            return "the `tests` arguments of the traingate configuration", None
        setters = self.hooks("pytest_configure", "pytest_load_initial_conftests")
        where = f" ({', '.join(hook_site(h) for h in setters)})" if setters else ""
        return f"neither `addopts` nor `tests`: a conftest or plugin set it{where}", hook_location(setters[0]) if setters else None

    def hooks(self, *names: str) -> list[TargetHook]:
        return [h for h in self.target_hooks if h.hook in names]


def hook_site(hook: TargetHook) -> str:
    return f"{hook.hook} at {hook.path}:{hook.line}" + (" (wrapper)" if hook.wrapper else "")


def hook_location(hook: TargetHook) -> Location:
    return Location(path=hook.path, line=hook.line, function=hook.hook)


def site_location(site: TargetFrame | None) -> Location | None:
    if site is None or not site.path:
        return None
    return Location(path=site.path, line=site.line, function=site.function)


def _skip_location(skip: SkipSite | None) -> Location | None:
    if skip is None or not skip.path:
        return None
    return Location(path=skip.path, line=skip.line)


def test_records(result: SuiteResult, selection: Selection, root: Path) -> list[TestRecord]:
    """One record per test pytest reported, deselected or kept out of collection."""
    records = [_ran_record(t, result, selection) for t in result.tests]
    for item in result.deselected_items:
        records.append(
            TestRecord(
                nodeid=item.nodeid, outcome="deselected", path=item.path, line=item.line,
                source_hash=item.source_hash, taken_out=_deselection(item, selection),
            )
        )
    reported = {t.nodeid for t in result.tests}
    for nodeid in result.collected_ids or []:
        if nodeid not in reported:
            known = result.item(nodeid)
            records.append(
                TestRecord(
                    nodeid=nodeid, outcome="not-run", path=known.path if known else None, line=known.line if known else None,
                    source_hash=known.source_hash if known else None, taken_out=_not_run(result, selection),
                )
            )
    for skip in result.collect_skips:
        path = skip.nodeid.split("::", 1)[0]
        records.append(
            TestRecord(
                nodeid=skip.nodeid, outcome="not-collected", path=path,
                taken_out=TakenOut(how="module-skipped", by="skipped while its module was collected", reason=skip_reason(skip.reason), where=Location(path=skip.path or path, line=skip.line)),
            )
        )
    for ignored in result.ignored:
        for path in _test_files(root, ignored.path, ignored.is_dir):
            records.append(TestRecord(nodeid=path, outcome="not-collected", path=path, taken_out=_ignore(ignored, selection)))
    return records


def _ran_record(test: TestOutcome, result: SuiteResult, selection: Selection) -> TestRecord:
    item = result.item(test.nodeid)
    rewritten = "; ".join(f"{r.did}, but its {r.when} report says {r.reported}" for r in test.rewrites) or None
    return TestRecord(
        nodeid=test.nodeid, outcome=test.outcome, path=test.path or (item.path if item else None), line=test.line or (item.line if item else None),
        source_hash=item.source_hash if item else None, duration_s=round(test.duration_s, 3), message=test.message,
        taken_out=taken_out(test, item, selection), rewritten=rewritten, optimizer_steps=test.optimizer_steps,
        step_sites=test.step_sites,
    )


def taken_out(test: TestOutcome, item: ItemRecord | None, selection: Selection) -> TakenOut | None:
    """How a skipped or xfailed test came to be so: its marker (declared in the source or added
    by a hook), or a `pytest.skip()`/`pytest.xfail()` call, and where."""
    if test.outcome not in ("skipped", "xfailed"):
        return None
    kind = "skip" if test.outcome == "skipped" else "xfail"
    raised = _raised(test)
    if raised is not None and not raised.by_marker and raised.kind == kind:
        return TakenOut(how=f"{kind}-call", by=_call_words(kind, raised.site, test), reason=test.message, where=site_location(raised.site))
    names = ("skip", "skipif") if kind == "skip" else ("xfail",)
    mark = next((m for m in (item.marks if item else []) if m.name in names), None)
    if mark is None:
        return TakenOut(how=f"{kind}-call", by=f"pytest.{kind}() or a hook", reason=test.message, where=_skip_location(test.skip) if kind == "skip" else None)
    own = Location(path=test.path, line=test.line, function=_function(test.nodeid)) if test.path else None
    if mark.declared:
        return TakenOut(how=f"{kind}-marker", by=f"@pytest.mark.{mark.name}", reason=test.message, where=own, strict=mark.strict)
    site = mark.site
    hooks = selection.hooks("pytest_collection_modifyitems", "pytest_itemcollected", "pytest_runtest_setup")
    by = f"a hook added the {mark.name} mark" + (f" ({site.function} at {site.path}:{site.line})" if site else (f" ({', '.join(hook_site(h) for h in hooks)})" if hooks else ""))
    where = site_location(site) or (hook_location(hooks[0]) if hooks else own)
    return TakenOut(how=f"{kind}-marker-added", by=by, reason=test.message, where=where, strict=mark.strict)


def _raised(test: TestOutcome) -> RaisedException | None:
    for when in ("call", "setup"):
        phase = test.phase(when)
        observed = phase.observed if phase is not None else None
        raised = (observed.raised or observed.fixture_raised) if observed is not None else None
        if raised is not None:
            return raised
    return None


def _call_words(kind: str, site: TargetFrame | None, test: TestOutcome) -> str:
    if site is None:
        return f"pytest.{kind}() outside the target's code"
    if site.function == _function(test.nodeid) and site.path == test.path:
        return f"pytest.{kind}() in the test"
    return f"pytest.{kind}() in {site.function} ({site.path}:{site.line}), outside the test"


def _deselection(item: DeselectedEvent, selection: Selection) -> TakenOut:
    dest = _DESELECTED_BY.get(item.option) if item.option else None
    if dest is not None and dest in selection.effective:
        source, where = selection.source(dest)
        return TakenOut(how="deselected", by=f"{selection.describe(dest)} ({source})", where=where)
    if item.site is None and "silently" in item.by:
        hooks = selection.hooks("pytest_collection_modifyitems")
        by = item.by + (f" ({', '.join(hook_site(h) for h in hooks)})" if hooks else "")
        return TakenOut(how="deselected", by=by, where=hook_location(hooks[0]) if hooks else None)
    return TakenOut(how="deselected", by=item.by, where=site_location(item.site))


def _not_run(result: SuiteResult, selection: Selection) -> TakenOut:
    """Why a collected test got no outcome: an option that lists instead of running, or one
    that stops at the first failures, or a run that ended early."""
    for dest in ("collectonly", "setuponly", "setupplan", "showfixtures", "show_fixtures_per_test", "maxfail"):
        if dest in selection.effective:
            source, where = selection.source(dest)
            return TakenOut(how="not-run", by=f"{selection.describe(dest)} ({source})", where=where)
    return TakenOut(how="not-run", by=f"the run stopped before it ({result.stopped})" if result.stopped else "the run ended before it")


def _ignore(ignored: IgnoredEvent, selection: Selection) -> TakenOut:
    by = ignored.by
    dest = _IGNORED_BY.get(by)
    if dest is not None and dest in selection.effective:
        source, where = selection.source(dest)
        return TakenOut(how="ignored", by=f"{selection.describe(dest)} ({source})", where=where)
    hooks = selection.hooks("pytest_ignore_collect") if "hook" in by else []
    return TakenOut(how="ignored", by=by + (f" ({', '.join(hook_site(h) for h in hooks)})" if hooks else ""), where=hook_location(hooks[0]) if hooks else None)


def _test_files(root: Path, path: str, is_dir: bool) -> list[str]:
    if not is_dir:
        return [path] if TEST_FILE.match(Path(path).name) else []
    return sorted(p.relative_to(root).as_posix() for p in (root / path).rglob("*.py") if TEST_FILE.match(p.name) and not _NOT_SOURCE & set(p.relative_to(root).parts))


def repo_test_files(root: Path) -> list[str]:
    """Every `test_*.py` / `*_test.py` in the target's tree, outside hidden and tool folders."""
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if TEST_FILE.match(path.name) and not any(part.startswith(".") or part in _NOT_SOURCE for part in rel.parts[:-1]):
            found.append(rel.as_posix())
    return sorted(found)


def _function(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]


def _line_with(path: Path, text: str) -> int | None:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return next((i for i, line in enumerate(lines, start=1) if line.lstrip().startswith(text)), None)
