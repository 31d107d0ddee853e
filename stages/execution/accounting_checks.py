"""Findings from the test accounting: outcomes a hook rewrote, options that narrowed or stopped
the run, tests a hook skipped or xfailed, test files the suite leaves out, and — against a
`--baseline` — tests that passed there and were taken out here (`test-disabled`).
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from traingate.stages.execution.details import BaselineTests
from traingate.pipeline.model.findings import locations_data
from traingate.pipeline.model.schema import LOCATIONS_KEY, Evidence, EvidenceKind, Finding, Location, PipelineReport, Severity, TestRecord
from traingate.stages.base import StageContext
from traingate.stages.execution.accounting import Selection, hook_location, hook_site, repo_test_files
from traingate.stages.execution.suite import PhaseRewrite, SuiteResult, SuiteRun
from traingate.stages.execution.rules import SKIPPED_TESTS, TEST_DISABLED, TEST_SELECTION

MAX_NAMED = 20
# Options after which pytest runs no test at all: the gate cannot observe the suite.
STOPPING = ("collectonly", "setuponly", "setupplan", "showfixtures", "show_fixtures_per_test")
NARROWING = ("keyword", "markexpr", "deselect", "ignore", "ignore_glob", "maxfail", "lf", "failedfirst", "newfirst", "stepwise", "plugins")
# Outcomes of a test that was in the suite but did not run to a verdict of its own.
TAKEN_OUT = ("skipped", "xfailed", "deselected", "not-collected", "not-run")


def _named(nodeids: list[str]) -> str:
    shown = ", ".join(f"`{n}`" for n in nodeids[:MAX_NAMED])
    return shown + (f" and {len(nodeids) - MAX_NAMED} more" if len(nodeids) > MAX_NAMED else "")


def rewritten_outcomes(ctx: StageContext, result: SuiteResult, selection: Selection) -> list[Finding]:
    """`stage-error`: a test whose logged outcome is not what it did — a hook or plugin rewrote
    the report (or made one up). Never waivable: the run's results cannot be believed."""
    found = []
    for test in result.tests:
        for rewrite in test.rewrites[:1]:  # the first phase rewritten; the evidence lists them all
            names = _rewriting_hooks(rewrite)
            hooks = selection.hooks(*names)
            who = ", ".join(hook_site(h) for h in hooks) or "a hook or plugin outside the target's files"
            location = hook_location(hooks[0]) if hooks else Location(path=test.path or test.nodeid.split("::")[0], line=test.line)
            found.append(
                ctx.stage_error(
                    f"the outcome of {test.nodeid} was rewritten",
                    reason="outcome-rewritten",
                    key=test.nodeid,
                    title=f"{test.nodeid}: {rewrite.did}, but its {rewrite.when} report says {rewrite.reported}",
                    location=location,
                    problem=(
                        f"The gate watched {test.nodeid}'s {rewrite.when} phase from outside every hook: {rewrite.did}. "
                        f"The report pytest logged says {rewrite.reported}"
                        + (f" (pytest's own report said {rewrite.made})" if rewrite.made and rewrite.made != rewrite.reported.split(" ")[0] else "")
                        + f". Rewritten by: {who}. The test is counted as failed."
                    ),
                    impact="A hook that turns failures into passes makes every green run of this suite worthless; no result of this run can be trusted.",
                    fix=f"Remove the code that rewrites test reports ({who}) and fix the test it hid.",
                    evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{rewrite.did}; logged: {rewrite.reported}", data={"nodeid": test.nodeid, **rewrite.model_dump(mode="json"), "phases": [r.model_dump(mode="json") for r in test.rewrites], "hooks": [h.model_dump() for h in hooks]}),
                )
            )
    return found


def _rewriting_hooks(rewrite: PhaseRewrite) -> tuple[str, ...]:
    if "teststatus" in rewrite.reported:
        return ("pytest_report_teststatus",)
    if rewrite.made and rewrite.made != rewrite.reported.split(" ")[0]:
        return ("pytest_runtest_makereport", "pytest_runtest_logreport")
    return ("pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_runtest_call", "pytest_pyfunc_call", "pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_teardown", "pytest_fixture_setup")


def observation_stopped(ctx: StageContext, run: SuiteRun, selection: Selection) -> list[Finding]:
    """`stage-error`: an option in the target's configuration under which pytest runs no test
    (`--collect-only`, `--setup-plan`, ...): the gate cannot observe the suite."""
    found = []
    for dest in STOPPING:
        if dest not in selection.effective:
            continue
        source, where = selection.source(dest)
        option = selection.describe(dest)
        found.append(
            ctx.stage_error(
                f"`{option}` ({source}) stops pytest from running the tests",
                reason="selection-stops-run",
                key=dest,
                location=where,
                problem=f"The pytest run had `{option}` in effect ({source}): pytest lists or plans the tests and runs none, so the gate could observe no outcome.",
                fix=f"Remove `{option}` from the target's pytest configuration; the gate decides how the suite runs.",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{option} in effect", data={"option": option, "source": source, "command": run.command}),
            )
        )
    return found


def selection_findings(ctx: StageContext, result: SuiteResult, selection: Selection, records: list[TestRecord]) -> list[Finding]:
    """`test-selection` (medium): each option of the target's that narrows the run, with the
    tests it took out; hooks that deselect or drop tests; paths kept out of collection."""
    found = []
    for dest in NARROWING:
        if dest not in selection.effective:
            continue
        option = selection.describe(dest)
        removed = [r.nodeid for r in records if r.taken_out is not None and r.taken_out.by.startswith(option)]
        source, where = selection.source(dest)
        if dest == "maxfail" and result.stopped:
            removed = [n for n in (result.collected_ids or []) if n not in {t.nodeid for t in result.tests}]
        found.append(_selection_finding(ctx, option, source, where, removed, key=f"option {dest}"))
    by_other: OrderedDict[str, list[TestRecord]] = OrderedDict()
    for record in records:
        taken = record.taken_out
        if taken is not None and taken.how in ("deselected", "ignored") and not any(taken.by.startswith(selection.describe(d)) for d in NARROWING if d in selection.effective):
            by_other.setdefault(taken.by, []).append(record)
    for by, group in by_other.items():
        found.append(_selection_finding(ctx, by, "", group[0].taken_out.where if group[0].taken_out else None, [r.nodeid for r in group], key=f"by {by}"))
    return found


def _selection_finding(ctx: StageContext, what: str, source: str, where: Location | None, removed: list[str], *, key: str) -> Finding:
    took = f"it took {len(removed)} test(s) or test file(s) out of the run: {_named(removed)}" if removed else "it took no test out of this run"
    return ctx.finding(
        category=TEST_SELECTION,
        severity=Severity.MEDIUM,
        title=f"The run was narrowed by {what}" + (f" ({source})" if source else "") + (f": {len(removed)} taken out" if removed else ""),
        location=where,
        problem=f"{what}" + (f", from {source}," if source else "") + f" shaped which tests ran; {took}.",
        impact="Tests left out of the run verify nothing; a failing test taken out this way would turn a red suite green.",
        fix="Let the gate run the whole suite: remove the option (or the hook), or have the CI pin the suite with `tests` in the policy file.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{what}: {len(removed)} taken out", data={"option": what, "source": source, "removed": removed[:200]}),
        key=key,
    )


def hidden_skips(ctx: StageContext, records: list[TestRecord]) -> list[Finding]:
    """Skips a hook or fixture made rather than the test's own decorator or body, and every
    xfail: medium, one finding per way and reason, naming the tests."""
    groups: OrderedDict[tuple[str, str, str], list[TestRecord]] = OrderedDict()
    for record in records:
        taken = record.taken_out
        if taken is None or not reported_apart(record):
            continue
        groups.setdefault((record.outcome, taken.by, taken.reason), []).append(record)
    found = []
    for (outcome, by, reason), group in groups.items():
        taken = group[0].taken_out
        assert taken is not None
        strict = "" if taken.strict is None else (" (strict)" if taken.strict else " (not strict: an unexpected pass does not fail)")
        verb = "xfailed" if outcome == "xfailed" else "skipped by a hook or fixture"
        found.append(
            ctx.finding(
                category=SKIPPED_TESTS,
                severity=Severity.MEDIUM,
                title=f"{len(group)} test(s) {verb}: {reason or 'no reason given'}",
                location=taken.where,
                problem=f"{_named([r.nodeid for r in group])} {'were' if len(group) > 1 else 'was'} {outcome} by {by}{strict}, reason \"{reason or 'no reason given'}\": a failure in what they check would not fail the run.",
                impact="An xfail or a skip added outside the test's own code hides a failing test as well as a real limitation; compare with a baseline to see whether these tests passed before.",
                fix="Fix the test and remove the xfail or the hook's skip; if the limitation is real, declare it on the test itself with a reason (`@pytest.mark.skipif(...)`).",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{len(group)} {outcome} by {by}", data={"tests": [r.nodeid for r in group][:200], "by": by, "reason": reason, "strict": taken.strict}),
                key=f"{outcome} {by} {reason}",
            )
        )
    return found


def module_skips(ctx: StageContext, records: list[TestRecord]) -> list[Finding]:
    """`skipped-tests` (low): test modules skipped while they were collected (`pytest.skip(...,
    allow_module_level=True)`, `pytest.importorskip` at their top): none of their tests is even
    collected, so no count shows them. One finding per reason, each module a location."""
    groups: OrderedDict[str, list[TestRecord]] = OrderedDict()
    for record in records:
        if record.taken_out is not None and record.taken_out.how == "module-skipped":
            groups.setdefault(record.taken_out.reason, []).append(record)
    found = []
    for reason, group in groups.items():
        modules = [r.nodeid for r in group]
        places = [r.taken_out.where or Location(path=r.nodeid) for r in group if r.taken_out is not None]
        one = len(group) == 1
        found.append(
            ctx.finding(
                category=SKIPPED_TESTS,
                severity=Severity.LOW,
                title=(f"{modules[0]} skipped" if one else f"{len(group)} test modules skipped") + f" at collection: {reason}",
                location=places[0] if one else None,
                problem=f"{_listed(modules)} {'was' if one else 'were'} skipped while pytest collected {'it' if one else 'them'} (reason \"{reason}\"): none of {'its' if one else 'their'} tests was collected or run.",
                impact="Their tests verify nothing in this run, and no test count includes them.",
                fix="Run them where their condition holds, or remove the module-level skip if it no longer applies.",
                evidence=Evidence(
                    kind=EvidenceKind.OBSERVED,
                    summary=f"{len(group)} module(s) skipped: {reason}",
                    data={"modules": modules, "reason": reason, LOCATIONS_KEY: locations_data(places)},
                ),
                key=f"module skipped {reason}",
            )
        )
    return found


def _listed(paths: list[str]) -> str:
    return ", ".join(paths[:MAX_NAMED]) + (f" and {len(paths) - MAX_NAMED} more" if len(paths) > MAX_NAMED else "")


def reported_apart(record: TestRecord) -> bool:
    """A skip a hook or fixture made, or any xfail: `hidden_skips` names it, not the plain skip groups."""
    taken = record.taken_out
    if taken is None or record.outcome not in ("skipped", "xfailed"):
        return False
    return taken.how.startswith("xfail") or taken.how == "skip-marker-added" or (taken.how == "skip-call" and taken.by != "pytest.skip() in the test")


def left_out_files(ctx: StageContext, result: SuiteResult, records: list[TestRecord]) -> list[Finding]:
    """`test-selection` (low): the test files in the repository the configured suite never
    reached, one finding for all of them (one cause: what `tests` names), each file a location."""
    reached = {r.path for r in records if r.path} | {e.path for e in result.collection_errors}
    left = [f for f in repo_test_files(ctx.root) if f not in reached and _defines_tests(ctx.root / f)]
    if not left:
        return []
    named = _listed(left)
    first = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
    places = [Location(path=path, line=None) for path in left]
    return [
        ctx.finding(
            category=TEST_SELECTION,
            severity=Severity.LOW,
            title=f"{len(left)} test file{'s are' if len(left) > 1 else ' is'} not part of the test run: {first}",
            location=None,  # the cause is the configuration; the files are the evidence's locations
            problem=f"{named} define{'s' if len(left) == 1 else ''} tests, but the suite the gate ran ({ctx.config.tests_described()}) did not collect {'it' if len(left) == 1 else 'them'}.",
            impact="Their tests verify nothing in this run. If leaving them out is deliberate (they need packages the CI does not install), this note is the only trace of it.",
            fix="Add their folders to `tests`, or move them under a folder the suite runs; a file that is not a test module, rename it.",
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"{len(left)} test file(s) not collected",
                data={"tests": ctx.config.tests, "files": left, LOCATIONS_KEY: locations_data(places)},
            ),
            key="left out test files",
        )
    ]


def _defines_tests(path: Path) -> bool:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return "def test" in text


def baseline_records(baseline: PipelineReport | None) -> tuple[list[TestRecord] | None, str]:
    """The baseline's execution records (validated with the report), or None and why they cannot be compared."""
    if baseline is None:
        return None, "no --baseline given"
    stage = next((s for s in baseline.stages if s.name == "execution"), None)
    if stage is None:
        return None, "the baseline report has no execution stage"
    if not stage.tests:
        return None, "the baseline report holds no per-test records (written before they existed, or its suite did not run)"
    return list(stage.tests), ""


def disabled_against_baseline(ctx: StageContext, records: list[TestRecord], base: list[TestRecord], version: str) -> tuple[list[Finding], BaselineTests]:
    """`test-disabled` (high): a test that passed in the baseline and here is skipped, xfailed,
    deselected, not collected, or gone. A test whose node id changed is followed by the hash of
    its function's source."""
    now = {r.nodeid: r for r in records}
    base_ids = {r.nodeid for r in base}
    by_hash = {r.source_hash: r for r in records if r.source_hash and r.nodeid not in base_ids}
    by_path = {r.path: r for r in records if r.outcome == "not-collected" and r.path}
    reached = frozenset(r.path for r in records if r.path and r.outcome != "not-collected")
    found: list[Finding] = []
    moved: list[dict[str, str]] = []
    newly_passing: list[dict[str, str]] = []
    disabled: list[str] = []
    for old in base:
        current = now.get(old.nodeid)
        if current is None and old.source_hash in by_hash:
            current = by_hash[old.source_hash]
            moved.append({"from": old.nodeid, "to": current.nodeid})
        if current is None and old.path in by_path:
            current = by_path[old.path]
        if old.outcome != "passed":
            if current is not None and current.outcome == "passed":
                newly_passing.append({"nodeid": current.nodeid, "was": old.outcome})
            continue
        if current is not None and current.outcome not in TAKEN_OUT:
            continue
        found.append(_disabled(ctx, old, current, version, reached))
        disabled.append(old.nodeid)
    return found, BaselineTests(version=version, compared=len(base), moved=moved, newly_passing=newly_passing, disabled=disabled)


def _disabled(ctx: StageContext, old: TestRecord, current: TestRecord | None, version: str, reached: frozenset[str]) -> Finding:
    if current is not None and current.taken_out is not None:
        taken = current.taken_out
        how = f"{current.outcome} by {taken.by}" + (f", reason \"{taken.reason}\"" if taken.reason else "")
        where = taken.where
    else:
        how, where = _gone(ctx.root, old, ctx.config.tests or [], reached)
    name = current.nodeid if current is not None and current.nodeid != old.nodeid else old.nodeid
    return ctx.finding(
        category=TEST_DISABLED,
        severity=Severity.HIGH,
        title=f"{old.nodeid} passed in the baseline ({version}) and is taken out here: {how}",
        location=where or Location(path=old.path or old.nodeid.split("::")[0], line=old.line, function=old.nodeid.split("::")[-1].split("[")[0]),
        problem=f"{old.nodeid} passed in the baseline ({version})" + (f"; here it is {name}" if name != old.nodeid else "") + f", and in this run it is {how}. What it checks was not verified in this version.",
        impact="Taking a failing test out of the run (skip, xfail, deselect, ignore, delete) is the commonest way a red suite is made green; a gate that lets it through verifies nothing.",
        fix="Restore the test and fix what makes it fail. If the removal is intended, accept this finding with a waiver that says why.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"baseline {version}: passed; now: {how}", data={"nodeid": old.nodeid, "now": name, "baseline_version": version, "how": how}),
        key=old.nodeid,
    )


def _gone(root: Path, old: TestRecord, tests: list[str], reached: frozenset[str] = frozenset()) -> tuple[str, Location | None]:
    """A baseline test this run has no record of: deleted, or its file left out of the suite."""
    path = old.path or old.nodeid.split("::")[0]
    function = old.nodeid.split("::")[-1].split("[")[0]
    file = root / path
    if not file.is_file():
        return f"deleted (its file {path} is gone)", None
    if f"def {function}" not in file.read_text(encoding="utf-8", errors="replace"):
        return f"deleted from {path}", Location(path=path, line=None)
    if path in reached:
        return (
            f"not collected: {path} still defines it and ran, but this test was not collected "
            "(a `python_functions`/`python_classes` setting, a collection hook, or a changed signature)"
        ), Location(path=path, line=None, function=function)
    return f"not collected: {path} still defines it, but the suite this version ran (`tests = {tests}`) did not reach it", Location(path=path, line=None, function=function)
