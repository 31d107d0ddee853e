"""Findings of the baseline's tests replayed on this version (`replay`, docs/edited-tests.md).

`test-weakened` (high): a test that passed in the baseline fails here in its baseline form by
its own verdict (an assertion, any exception that is not an interface change, a skip): the
change rewrote the test it breaks. `test-weakened/interface-changed` (medium): the baseline's
form stops at a TypeError, ImportError, AttributeError or NameError (a renamed argument or
function, the tests updated with it). `test-weakened/not-replayed` (medium): the tests could
not be replayed (no commit recorded, the commit not in this clone).
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import subprocess
from dataclasses import dataclass

from traingate.stages.execution.details import ReplayDetails, ReplayRow
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity, TestRecord
from traingate.stages.base import StageContext
from traingate.pipeline.model.text import clip_line, first_line
from traingate.stages.execution.replay import NotReplayed, ReplayPlan, build_view, open_tree, plan_replay, remove_view
from traingate.stages.execution.suite import SuiteResult, SuiteRun, parse_events, run_suite
from traingate.stages.execution.rules import TEST_WEAKENED

# Exceptions that say the code's interface changed under the baseline's form of a test.
INTERFACE_ERRORS = frozenset({"TypeError", "ImportError", "ModuleNotFoundError", "AttributeError", "NameError"})
INTERFACE_RULE = "test-weakened/interface-changed"
NOT_REPLAYED_RULE = "test-weakened/not-replayed"
MAX_DIFF_CHARS = 6000
VIEW_SHOWN = "<baseline tests over this version>"


@dataclass(frozen=True)
class Verdict:
    """What the baseline's form of one test did on this version."""

    nodeid: str
    verdict: str  # passed | weakened | interface | environment
    outcome: str  # the replay's outcome of the test (or "not-collected", "not-run")
    error: str  # `Type: message` of what stopped it; "" when it passed
    traceback: str


def prepare_replay(ctx: StageContext, base: list[TestRecord] | None) -> ReplayPlan | NotReplayed | None:
    """What to replay (None: no baseline with per-test records)."""
    if base is None or ctx.baseline is None:
        return None
    tree = open_tree(ctx.origin, ctx.baseline.target.commit)
    if isinstance(tree, NotReplayed):
        return tree
    try:
        return plan_replay(ctx.root, tree, base)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return NotReplayed(f"the files of commit {tree.commit} could not be read: {exc}", tree.commit)


def run_replay(ctx: StageContext, plan: ReplayPlan, name: str) -> SuiteRun:
    """The baseline's test files in a pytest child, isolated and budgeted like the suite."""
    view = build_view(ctx.root, plan.overlay)
    try:
        run = run_suite(ctx, name, [], root=view, tests=plan.files)
    finally:
        remove_view(view)
    # The folder is gone once the run is over: reports name it by what it was.
    return dataclasses.replace(run, args=[a.replace(str(view), VIEW_SHOWN) for a in run.args])


def verdicts(plan: ReplayPlan, run: SuiteRun) -> list[Verdict]:
    result = parse_events(run.events)
    return [_verdict(test, result, run) for test in plan.tests]


def _verdict(test: TestRecord, result: SuiteResult, run: SuiteRun) -> Verdict:
    done = next((t for t in result.tests if t.nodeid == test.nodeid), None)
    if done is not None:
        if done.outcome in ("passed", "xpassed"):
            return Verdict(test.nodeid, "passed", done.outcome, "", "")
        failure = done.failure
        error = f"{failure.type}: {first_line(failure.message, 300)}" if failure is not None else first_line(done.message, 300) or done.outcome
        trace = done.longrepr or (failure.traceback if failure is not None else "")
        if failure is not None and failure.environment is not None:
            return Verdict(test.nodeid, "environment", done.outcome, error, trace)
        interface = failure is not None and failure.type in INTERFACE_ERRORS and done.outcome in ("failed", "error")
        return Verdict(test.nodeid, "interface" if interface else "weakened", done.outcome, error, trace)
    broken = next((e for e in result.collection_errors if e.path == test.path), None)
    if broken is not None:
        error = f"{broken.type or 'collection error'}: {first_line(broken.message or broken.longrepr, 300)}"
        verdict = "environment" if broken.environment is not None else ("interface" if broken.type in INTERFACE_ERRORS else "weakened")
        return Verdict(test.nodeid, verdict, "not-collected", error, broken.traceback or broken.longrepr)
    if run.child.timed_out or not result.finished or run.channel_problem:
        why = run.channel_problem or ("the replay overran its budget" if run.child.timed_out else "the replay's pytest process ended before it")
        return Verdict(test.nodeid, "weakened", "not-run", why, run.child.stderr[-3000:])
    return Verdict(test.nodeid, "interface", "not-collected", "its baseline form is not collected with this version's code", "")


def replay_findings(ctx: StageContext, plan: ReplayPlan | NotReplayed | None, run: SuiteRun | None, records: list[TestRecord], base: list[TestRecord] | None, version: str) -> tuple[list[Finding], ReplayDetails | None]:
    if plan is None or base is None:
        return [], None
    if isinstance(plan, NotReplayed):
        changed = _changed_by_hash(records, base)
        return [_not_replayed(ctx, plan, changed)] if changed else [], ReplayDetails(commit=plan.commit, note=f"not replayed: {plan.reason}", files=[], tests=[])
    if run is None:
        return [], ReplayDetails(commit=plan.commit, note="no test code changed since the baseline", files=[], tests=[])
    now = {r.nodeid: r for r in records}
    found: list[Finding] = []
    rows = []
    for verdict in verdicts(plan, run):
        rows.append(ReplayRow(nodeid=verdict.nodeid, verdict=verdict.verdict, outcome=verdict.outcome, error=clip_line(verdict.error, 300)))
        if verdict.verdict in ("weakened", "interface"):
            found.append(_replay_finding(ctx, plan, verdict, base, now.get(verdict.nodeid), version))
    return found, ReplayDetails(commit=plan.commit, note="", files=plan.files, tests=rows, command=run.command, duration_s=round(run.child.duration_s, 3))


def _changed_by_hash(records: list[TestRecord], base: list[TestRecord]) -> list[str]:
    """Baseline-passed tests whose function's source differs here (or is gone), as the hashes tell."""
    hashes = {(r.nodeid, r.source_hash) for r in records}
    return [b.nodeid for b in base if b.outcome == "passed" and (b.nodeid, b.source_hash) not in hashes]


def _replay_finding(ctx: StageContext, plan: ReplayPlan, verdict: Verdict, base: list[TestRecord], current: TestRecord | None, version: str) -> Finding:
    old = next(b for b in base if b.nodeid == verdict.nodeid)
    path = old.path or old.nodeid.split("::")[0]
    diff = source_diff(plan, ctx, old, current)
    new_form = f"its current form {current.outcome}" if current is not None else "its current form is gone"
    changed = ", ".join(plan.changed.get(path, [path]))
    where = Location(path=current.path, line=current.line, function=_function(current.nodeid)) if current is not None and current.path else Location(path=path, line=old.line, function=_function(old.nodeid))
    data = {"nodeid": old.nodeid, "baseline_version": version, "commit": plan.commit, "replay_outcome": verdict.outcome, "error": verdict.error, "current_outcome": current.outcome if current else None, "changed": plan.changed.get(path, []), "diff": diff}
    evidence = Evidence(kind=EvidenceKind.OBSERVED, summary=clip_line(f"baseline form on this version: {verdict.outcome}: {verdict.error}", 300), traceback=verdict.traceback[-8000:] or None, data=data)
    ran = f"{old.nodeid} passed in the baseline ({version}, commit {plan.commit[:12]}). This version changed its test code ({changed}); run in its baseline form against this version's code, it"
    if verdict.verdict == "interface":
        severity = Severity.HIGH if ctx.config.policy.interface_changes_block else Severity.MEDIUM
        return ctx.finding(
            category=TEST_WEAKENED, rule=INTERFACE_RULE, severity=severity, location=where, evidence=evidence, key=old.nodeid,
            title=clip_line(f"{old.nodeid}: the baseline's form no longer runs here ({verdict.error}); {new_form}", 300),
            problem=f"{ran} stops at {verdict.error}: the interface it calls changed, and the test was updated with it; {new_form}. Whether the behaviour it checks is the same is not verified by the baseline's form.",
        )
    did = "is skipped" if verdict.outcome in ("skipped", "xfailed") else f"fails ({verdict.error})" if verdict.outcome != "not-run" else f"did not finish ({verdict.error})"
    return ctx.finding(
        category=TEST_WEAKENED, location=where, evidence=evidence, key=old.nodeid,
        title=clip_line(f"{old.nodeid} passed in the baseline ({version}); its baseline form {did} on this version", 300),
        problem=f"{ran} {did}; {new_form}. The change edited the test that its code now fails: what the test checked no longer holds.",
    )


def _not_replayed(ctx: StageContext, plan: NotReplayed, changed: list[str]) -> Finding:
    shown = ", ".join(changed[:10]) + (f" and {len(changed) - 10} more" if len(changed) > 10 else "")
    return ctx.finding(
        category=TEST_WEAKENED, rule=NOT_REPLAYED_RULE, location=None, key="not-replayed",
        title=clip_line(f"baseline tests not replayed: {plan.reason}", 300),
        problem=f"{len(changed)} test(s) that passed in the baseline changed in this version ({shown}), and their baseline form could not be run on this version: {plan.reason}. Whether the change weakened them was not checked.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=plan.reason, data={"commit": plan.commit, "reason": plan.reason, "tests": changed[:200]}),
    )


def source_diff(plan: ReplayPlan, ctx: StageContext, old: TestRecord, current: TestRecord | None) -> str:
    """The unified diff of the test's source from the baseline to this version."""
    path = old.path or old.nodeid.split("::")[0]
    before = function_source(plan.overlay.get(path) or "", old.nodeid)
    after = ""
    if current is not None and current.path:
        try:
            after = function_source((ctx.root / current.path).read_text(encoding="utf-8", errors="replace"), current.nodeid)
        except OSError:
            after = ""
    lines = difflib.unified_diff(before.splitlines(keepends=True), after.splitlines(keepends=True), fromfile=f"{path} (baseline {plan.commit[:12]})", tofile=(current.path if current and current.path else f"{path} (gone)"))
    return "".join(lines)[:MAX_DIFF_CHARS]


def function_source(text: str, nodeid: str) -> str:
    """The source of a test function (its decorators included) in a module's text; "" when not found."""
    names = [n.split("[")[0] for n in nodeid.split("::")[1:]]
    try:
        body: list[ast.stmt] = ast.parse(text).body
    except SyntaxError:
        return ""
    node: ast.stmt | None = None
    for name in names:
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name), None)
        if node is None:
            return ""
        body = node.body
    if node is None:
        return ""
    start = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
    return "".join(text.splitlines(keepends=True)[start - 1 : node.end_lineno])


def _function(nodeid: str) -> str:
    return nodeid.split("::")[-1].split("[")[0]
