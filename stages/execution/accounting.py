"""Every test accounted for: one record per test of the run, including the tests that did not
run (deselected, kept out of collection, skipped at collection), and how each was taken out.

Pure: reads the plugin's events as `SuiteResult` has folded them and the target's tree; the
findings built from these records live in `accounting_checks`.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from traingate.pipeline.schema import Location, TakenOut, TestRecord
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

    def __init__(self, event: dict[str, Any], root: Path, config_file: str | None) -> None:
        self.effective: dict[str, Any] = event.get("effective") or {}
        self._from_addopts: dict[str, Any] = event.get("from_addopts") or {}
        self._from_args: dict[str, Any] = event.get("from_args") or {}
        self.target_hooks: list[dict[str, Any]] = event.get("target_hooks") or []
        self._root = root
        self._config_file = config_file

    def describe(self, dest: str) -> str:
        """`-k 'not slow'`, `--deselect a --deselect b`, `-p no:warnings`."""
        value, flag = self.effective.get(dest), _FLAGS.get(dest, dest)
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

    def hooks(self, *names: str) -> list[dict[str, Any]]:
        return [h for h in self.target_hooks if h.get("hook") in names]


def hook_site(hook: dict[str, Any]) -> str:
    return f"{hook.get('hook')} at {hook.get('path')}:{hook.get('line')}" + (" (wrapper)" if hook.get("wrapper") else "")


def hook_location(hook: dict[str, Any]) -> Location:
    return Location(path=str(hook.get("path")), line=hook.get("line"), function=str(hook.get("hook")))


def site_location(site: dict[str, Any] | None) -> Location | None:
    if not site or not site.get("path"):
        return None
    return Location(path=str(site["path"]), line=site.get("line"), function=site.get("function"))


def test_records(result: SuiteResult, selection: Selection, root: Path) -> list[TestRecord]:
    """One record per test pytest reported, deselected or kept out of collection."""
    records = [_ran_record(t, result, selection) for t in result.tests]
    for item in result.deselected_items:
        records.append(
            TestRecord(
                nodeid=str(item["nodeid"]), outcome="deselected", path=item.get("path"), line=item.get("line"),
                source_hash=item.get("source_hash"), taken_out=_deselection(item, selection),
            )
        )
    reported = {t.nodeid for t in result.tests}
    for nodeid in result.collected_ids or []:
        if nodeid not in reported:
            item = result.items.get(nodeid, {})
            records.append(
                TestRecord(
                    nodeid=nodeid, outcome="not-run", path=item.get("path"), line=item.get("line"), source_hash=item.get("source_hash"),
                    taken_out=_not_run(result, selection),
                )
            )
    for skip in result.collect_skips:
        path = str(skip.get("nodeid") or "").split("::", 1)[0]
        records.append(
            TestRecord(
                nodeid=str(skip.get("nodeid")), outcome="not-collected", path=path,
                taken_out=TakenOut(how="module-skipped", by="skipped while its module was collected", reason=skip_reason(skip), where=Location(path=str(skip.get("path") or path), line=skip.get("line"))),
            )
        )
    for ignored in result.ignored:
        for path in _test_files(root, str(ignored["path"]), bool(ignored.get("is_dir"))):
            records.append(TestRecord(nodeid=path, outcome="not-collected", path=path, taken_out=_ignore(ignored, selection)))
    return records


def _ran_record(test: TestOutcome, result: SuiteResult, selection: Selection) -> TestRecord:
    item = result.items.get(test.nodeid, {})
    rewritten = "; ".join(f"{r['did']}, but its {r['when']} report says {r['reported']}" for r in test.rewrites) or None
    return TestRecord(
        nodeid=test.nodeid, outcome=test.outcome, path=test.path or item.get("path"), line=test.line or item.get("line"),
        source_hash=item.get("source_hash"), duration_s=round(test.duration_s, 3), message=test.message,
        taken_out=taken_out(test, item, selection), rewritten=rewritten,
    )


def taken_out(test: TestOutcome, item: dict[str, Any], selection: Selection) -> TakenOut | None:
    """How a skipped or xfailed test came to be so: its marker (declared in the source or added
    by a hook), or a `pytest.skip()`/`pytest.xfail()` call, and where."""
    if test.outcome not in ("skipped", "xfailed"):
        return None
    kind = "skip" if test.outcome == "skipped" else "xfail"
    raised = _raised(test)
    if raised is not None and not raised.get("by_marker") and raised.get("kind") == kind:
        site = raised.get("site")
        return TakenOut(how=f"{kind}-call", by=_call_words(kind, site, test), reason=test.message, where=site_location(site))
    names = ("skip", "skipif") if kind == "skip" else ("xfail",)
    mark = next((m for m in item.get("marks", []) if m.get("name") in names), None)
    if mark is None:
        return TakenOut(how=f"{kind}-call", by=f"pytest.{kind}() or a hook", reason=test.message, where=site_location((test.skip or {}) if kind == "skip" else None))
    own = Location(path=test.path, line=test.line, function=_function(test.nodeid)) if test.path else None
    if mark.get("declared"):
        return TakenOut(how=f"{kind}-marker", by=f"@pytest.mark.{mark['name']}", reason=test.message, where=own, strict=mark.get("strict"))
    site = mark.get("site")
    hooks = selection.hooks("pytest_collection_modifyitems", "pytest_itemcollected", "pytest_runtest_setup")
    by = f"a hook added the {mark['name']} mark" + (f" ({site.get('function')} at {site.get('path')}:{site.get('line')})" if site else (f" ({', '.join(hook_site(h) for h in hooks)})" if hooks else ""))
    where = site_location(site) or (hook_location(hooks[0]) if hooks else own)
    return TakenOut(how=f"{kind}-marker-added", by=by, reason=test.message, where=where, strict=mark.get("strict"))


def _raised(test: TestOutcome) -> dict[str, Any] | None:
    for when in ("call", "setup"):
        observed = (test.phases.get(when) or {}).get("observed") or {}
        raised = observed.get("raised") or observed.get("fixture_raised")
        if raised is not None:
            return dict(raised)
    return None


def _call_words(kind: str, site: dict[str, Any] | None, test: TestOutcome) -> str:
    if not site:
        return f"pytest.{kind}() outside the target's code"
    if site.get("function") == _function(test.nodeid) and site.get("path") == test.path:
        return f"pytest.{kind}() in the test"
    return f"pytest.{kind}() in {site.get('function')} ({site.get('path')}:{site.get('line')}), outside the test"


def _deselection(item: dict[str, Any], selection: Selection) -> TakenOut:
    option = item.get("option")
    dest = _DESELECTED_BY.get(str(option)) if option else None
    if dest is not None and dest in selection.effective:
        source, where = selection.source(dest)
        return TakenOut(how="deselected", by=f"{selection.describe(dest)} ({source})", where=where)
    site = item.get("site")
    if site is None and "silently" in str(item.get("by")):
        hooks = selection.hooks("pytest_collection_modifyitems")
        by = str(item.get("by")) + (f" ({', '.join(hook_site(h) for h in hooks)})" if hooks else "")
        return TakenOut(how="deselected", by=by, where=hook_location(hooks[0]) if hooks else None)
    return TakenOut(how="deselected", by=str(item.get("by")), where=site_location(site))


def _not_run(result: SuiteResult, selection: Selection) -> TakenOut:
    """Why a collected test got no outcome: an option that lists instead of running, or one
    that stops at the first failures, or a run that ended early."""
    for dest in ("collectonly", "setuponly", "setupplan", "showfixtures", "show_fixtures_per_test", "maxfail"):
        if dest in selection.effective:
            source, where = selection.source(dest)
            return TakenOut(how="not-run", by=f"{selection.describe(dest)} ({source})", where=where)
    return TakenOut(how="not-run", by=f"the run stopped before it ({result.stopped})" if result.stopped else "the run ended before it")


def _ignore(ignored: dict[str, Any], selection: Selection) -> TakenOut:
    by = str(ignored.get("by"))
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
