"""The execution stage: run the target's tests, smoke-call its entrypoint, check that the
tests reach the entrypoint, and report the deprecated PyTorch APIs they hit.

The test suite and the smoke call run side by side in two child processes, each under the
stage's remaining budget, so a hang in one never starves the other of time. Neither runs
in this process. Its checks read what the runs handed back, each in `CHECKS` below with the
categories it finds (test-failure, collection-error, no-tests, skipped-tests, test-environment,
the test accounting's, entrypoint-untested, entrypoint-crash, deprecated-api), plus hang and
stage-error.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from traingate.stages.execution.details import (
    Accounting,
    BaselineNotCompared,
    BaselineTests,
    CollectionErrorRow,
    EntrypointCoverage,
    ExecutionDetails,
    NoEntrypoint,
    NoSuite,
    PytestDetails,
    SmokeDetails,
    SmokeNotConfigured,
    SuiteCounts,
    TestRow,
    XdistDisabled,
)
from traingate.pipeline.model.schema import Finding, Metric, StageOutcome, TestRecord
from traingate.stages.base import StageContext, entrypoint_leftover_findings, leftover_findings
from traingate.stages.agent.checks import Check, Checked, run_checks
from traingate.stages.contract.messages import WarningRecord
from traingate.pipeline.model.text import first_line
from traingate.stages.execution.accounting import Selection, test_records
from traingate.stages.execution.accounting_checks import (
    baseline_records,
    disabled_against_baseline,
    hidden_skips,
    reported_apart,
    left_out_files,
    module_skips,
    observation_stopped,
    rewritten_outcomes,
    selection_findings,
)
from traingate.stages.execution.baseline_entry import baseline_smoke
from traingate.stages.execution.replay import NotReplayed, ReplayPlan
from traingate.stages.execution.observed import choose as choose_observed
from traingate.stages.execution.replay_checks import prepare_replay, replay_findings, run_replay
from traingate.stages.execution.checks import NO_SUITE_NOTE, no_suite_finding, suite_findings
from traingate.stages.execution.coverage import EntrypointSource, coverage_details, entrypoint_source, executed_lines, untested_finding
from traingate.stages.execution.smoke import SmokeResult, run_details, smoke_calls
from traingate.stages.execution.suite import SuiteResult, SuiteRun, counts, exit_meaning, group_skips, parse_events, run_suite
from traingate.stages.execution.deprecations import deprecated_api_findings, gather
from traingate.stages.execution.environment_groups import one_per_need

MAX_TEST_ROWS = 500


class ExecutionWork:
    """The stage's work, run in its agent (`traingate.stages.execution.spec.ExecutionStage` is what the gate registers)."""

    def run(self, ctx: StageContext) -> StageOutcome:
        runs = _run_children(ctx)
        checked = run_checks(CHECKS, runs, runs.findings)
        # One finding per missing package or network need, however many tests it failed.
        findings = one_per_need(ctx, runs.findings)
        pytest: PytestDetails | NoSuite = checked[SuiteAccounting.name]
        smoke_rows: SmokeDetails | SmokeNotConfigured = checked[SmokeCall.name]
        coverage: EntrypointCoverage | NoEntrypoint = checked[EntrypointTested.name]
        observed, observed_files = choose_observed(ctx, runs.records, runs.plan)
        details = ExecutionDetails(pytest=pytest, smoke=smoke_rows, coverage=coverage, warnings=checked[DeprecatedApis.name])
        return StageOutcome(
            summary=summary(runs.suite, runs.result, smoke_rows, coverage),
            metrics=metrics(runs.suite, runs.result, smoke_rows, coverage),
            findings=findings,
            tests=runs.records,
            details=details.model_dump(mode="json"),
            observed_training=observed,
            observed_files=observed_files,
        )


@dataclass
class ExecutionRuns:
    """What the stage's child runs handed back, which its checks read, and what they found."""

    ctx: StageContext
    source: EntrypointSource | None  # the entrypoint's function in its module; None: none configured
    suite: SuiteRun | None  # None: the repo declares no test suite (`tests = false`)
    smoke: SmokeResult | None  # the entrypoint's smoke calls and the baseline entrypoint's
    plan: ReplayPlan | NotReplayed | None  # the baseline's form of the tests whose code changed
    replay: SuiteRun | None
    baseline: tuple[list[TestRecord] | None, str]  # the baseline's per-test records, or None and why
    result: SuiteResult = field(init=False)
    selection: Selection = field(init=False)
    records: list[TestRecord] = field(init=False)  # one per test, for the report
    hidden: frozenset[str] = field(init=False)  # skipped tests the accounting reports on their own
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        suite = self.suite
        self.result = parse_events(suite.events) if suite else SuiteResult()
        self.selection = Selection(self.result.selection, self.ctx.root, suite.config_file if suite else None)
        self.records = test_records(self.result, self.selection, self.ctx.root) if suite else []
        self.hidden = frozenset(r.nodeid for r in self.records if reported_apart(r))


def _run_children(ctx: StageContext) -> ExecutionRuns:
    """The test suite, the smoke calls, the replay of the baseline's tests and the baseline's
    entrypoint, side by side, each in its own child process."""
    ep = ctx.config.entrypoint
    source = entrypoint_source(ctx.root, ep) if ep else None
    include = [str(source.file)] if source is not None and source.span else []
    # `tests = false`: the repo declares it has no suite; pytest is not run, and every
    # report says so (an info finding and the summary), so the stage is never silently green.
    declared = ctx.config.has_test_suite
    base, why_not = baseline_records(ctx.baseline)
    # The baseline's form of every test whose test code changed, beside the suite (docs/edited-tests.md).
    plan = prepare_replay(ctx, base) if declared else None
    with ThreadPoolExecutor(max_workers=4) as pool:
        suite_future = pool.submit(run_suite, ctx, ctx.next_name("pytest"), include) if declared else None
        replaying = isinstance(plan, ReplayPlan) and bool(plan.files)
        beside = int(declared) + int(replaying) + int(ctx.baseline_entrypoint is not None)
        smoke_future = pool.submit(smoke_calls, ctx, source, beside) if ep else None
        replay_future = pool.submit(run_replay, ctx, plan, ctx.next_name("replay")) if isinstance(plan, ReplayPlan) and plan.files else None
        # The baseline's entrypoint, where the change's configuration of it differs (docs/configuration.md).
        baseline_future = pool.submit(baseline_smoke, ctx) if ctx.baseline_entrypoint else None
        suite = suite_future.result() if suite_future else None
        smoke = with_baseline(smoke_future.result() if smoke_future else None, baseline_future.result() if baseline_future else None)
        replay = replay_future.result() if replay_future else None
    return ExecutionRuns(ctx, source, suite, smoke, plan, replay, (base, why_not))


class SuiteOutcomes:
    """test-failure, collection-error, no-tests, skipped-tests, test-environment: what pytest
    ran, failed, could not collect or skipped (`checks.py`); with no suite declared, one info
    finding that says so."""

    name = "suite"
    reads = ("pytest",)

    def evaluate(self, runs: ExecutionRuns) -> Checked:
        if runs.suite is None:
            return Checked([no_suite_finding(runs.ctx)])
        return Checked(suite_findings(runs.ctx, runs.suite, runs.result, runs.hidden))


class SuiteAccounting:
    """test-selection, test-disabled, test-weakened: the tests the run left out, skipped by a
    hook or rewrote, and, with a baseline, the tests it had that this version disabled or
    weakened (its edited tests replayed in the baseline's form)."""

    name = "pytest"
    reads = ("pytest", "replay")

    def evaluate(self, runs: ExecutionRuns) -> Checked:
        ctx, suite, result, records = runs.ctx, runs.suite, runs.result, runs.records
        if suite is None:
            return Checked(record=NoSuite(declared=False, note=NO_SUITE_NOTE))
        found = rewritten_outcomes(ctx, result, runs.selection) + observation_stopped(ctx, suite, runs.selection)
        found += selection_findings(ctx, result, runs.selection, records) + hidden_skips(ctx, records) + module_skips(ctx, records)
        found += left_out_files(ctx, result, records)
        base, why_not = runs.baseline
        comparison: BaselineTests | BaselineNotCompared = BaselineNotCompared(note=why_not)
        if base is not None:
            disabled, comparison = disabled_against_baseline(ctx, records, base, _baseline_version(ctx))
            found += disabled
        accounting = Accounting(
            taken_out=[r for r in records if r.taken_out is not None][:MAX_TEST_ROWS],
            rewritten=[r for r in records if r.rewritten][:MAX_TEST_ROWS],
            options={dest: runs.selection.describe(dest) for dest in runs.selection.effective},
            xdist_disabled=XdistDisabled.model_validate(result.xdist_disabled.model_dump()) if result.xdist_disabled else None,
            baseline=comparison,
        )
        replayed, accounting.replay = replay_findings(ctx, runs.plan, runs.replay, records, base, _baseline_version(ctx))
        return Checked(found + replayed, pytest_details(suite, result, accounting))


class EntrypointTested:
    """entrypoint-untested: no statement of the entrypoint's body ran while the tests ran
    (measured with coverage of its file); not measured is said, never passed."""

    name = "coverage"
    reads = ("pytest",)

    def evaluate(self, runs: ExecutionRuns) -> Checked:
        ctx, suite, result, source = runs.ctx, runs.suite, runs.result, runs.source
        if ctx.config.entrypoint is None:
            return Checked(record=coverage_details(None, None, "no entrypoint configured"))
        if source is None or not source.span:
            return Checked(record=coverage_details(source, None, "the entrypoint's body could not be read from its module file"))
        if suite is None:
            return Checked(record=coverage_details(source, None, "not measured: no test suite declared (`tests = false`)"))
        if suite.coverage_file is None or not result.finished:
            return Checked(record=coverage_details(source, None, "not measured: the test run did not complete"))
        if result.xdist_workers:
            return Checked(record=coverage_details(source, None, "not measured: the target's pytest options run the tests in xdist worker processes"))
        executed = executed_lines(suite.coverage_file, source.file)
        if executed is None:
            return Checked(record=coverage_details(source, None, "not measured: the coverage data could not be read"))
        finding = untested_finding(ctx, source, executed, suite.command)
        return Checked([finding] if finding is not None else [], coverage_details(source, executed))


class SmokeCall:
    """entrypoint-crash: the configured entrypoint called once with its smoke arguments (and
    the baseline's entrypoint, where the change's configuration of it differs)."""

    name = "smoke"
    reads = ("smoke",)

    def evaluate(self, runs: ExecutionRuns) -> Checked:
        smoke = runs.smoke
        return Checked(list(smoke.findings) if smoke is not None else [], smoke_details(runs.ctx, smoke))


class LeftoverProcesses:
    """Processes the test run or the smoke calls left running when they ended."""

    name = "leftovers"
    reads = ("pytest", "smoke")

    def evaluate(self, runs: ExecutionRuns) -> Checked:
        ctx = runs.ctx
        return Checked((leftover_findings(ctx, runs.suite.child, "The test run") if runs.suite else []) + entrypoint_leftover_findings(ctx))


class DeprecatedApis:
    """deprecated-api: the deprecated PyTorch APIs the tests and the smoke calls hit, from the
    warnings they raised."""

    name = "warnings"
    reads = ("pytest", "smoke")

    def evaluate(self, runs: ExecutionRuns) -> Checked:
        sites = gather(runs.ctx.root, runs.result.warnings, smoke_warnings(runs.smoke))
        rows = [s.row() for s in sorted(sites, key=lambda s: (not s.deprecated_torch_api, -s.count))][:100]
        return Checked(deprecated_api_findings(runs.ctx, sites), rows)


# Every check of the stage, in the order it runs over what its child runs handed back.
CHECKS: tuple[Check[ExecutionRuns], ...] = (SuiteOutcomes(), SuiteAccounting(), EntrypointTested(), SmokeCall(), LeftoverProcesses(), DeprecatedApis())


def _baseline_version(ctx: StageContext) -> str:
    return (ctx.baseline.version if ctx.baseline is not None else "") or "the baseline"


def pytest_details(suite: SuiteRun, result: SuiteResult, accounting: Accounting) -> PytestDetails:
    code = suite.child.returncode
    ordered = sorted(result.tests, key=lambda t: (t.outcome == "passed", t.outcome == "skipped"))
    return PytestDetails(
        command=suite.command,
        config_file=suite.config_file,
        source=suite.source,
        exit_status=code,
        exit_meaning=suite.child.signal_name or ("timed out" if suite.child.timed_out else exit_meaning(code if code is not None else -1, "not a pytest exit status")),
        duration_s=round(suite.child.duration_s, 3),
        timed_out=suite.child.timed_out,
        finished=result.finished,
        counts=counts(result),
        tests=[TestRow(nodeid=t.nodeid, outcome=t.outcome, duration_s=round(t.duration_s, 3), message=t.message) for t in ordered[:MAX_TEST_ROWS]],
        tests_omitted=max(0, len(ordered) - MAX_TEST_ROWS),
        skips=group_skips(result.tests),
        collection_errors=[CollectionErrorRow(nodeid=e.nodeid, type=e.type, message=first_line(e.message or "", 300)) for e in result.collection_errors],
        stdout_tail=suite.child.stdout[-3000:],
        accounting=accounting,
    )


def with_baseline(smoke: SmokeResult | None, baseline: SmokeResult | None) -> SmokeResult | None:
    """The change's smoke calls and the baseline entrypoint's, as one; a finding of the same id once."""
    if smoke is None or baseline is None:
        return smoke or baseline
    seen = {f.id for f in smoke.findings}
    note = "The baseline's entrypoint was smoke-called on this version too (baseline-smoke): the change's entrypoint configuration differs from it."
    return SmokeResult(runs=[*smoke.runs, *baseline.runs], findings=[*smoke.findings, *(f for f in baseline.findings if f.id not in seen)], notes=[*smoke.notes, note])


def smoke_warnings(smoke: SmokeResult | None) -> list[WarningRecord]:
    """The warnings every smoke call's harness recorded (its validated `HarnessResult`)."""
    results = [run.result for _, _, run in (smoke.runs if smoke else []) if run.result is not None]
    return [WarningRecord.model_validate(w) for result in results for w in result["warnings"]]


def smoke_details(ctx: StageContext, smoke: SmokeResult | None) -> SmokeDetails | SmokeNotConfigured:
    ep = ctx.config.entrypoint
    if ep is None or smoke is None:
        # The baseline's entrypoint may still have run: this version configures none where the baseline did.
        runs = [run_details(label, amp, run) for label, amp, run in smoke.runs] if smoke else []
        return SmokeNotConfigured(configured=False, runs=runs, notes=["No smoke call: no entrypoint is configured ([tool.traingate.entrypoint] call).", *(smoke.notes if smoke else [])])
    return SmokeDetails(
        configured=True, label=ep.label, call=ep.call, script=ep.script, args=ep.args,
        amp_args=ep.amp_args.model_dump() if ep.amp_args else None, setup=ep.setup, kwargs=ep.kwargs, amp_flag=ep.amp_flag,
        seed=ep.seed, device=ctx.device, runs=[run_details(label, amp, run) for label, amp, run in smoke.runs], notes=smoke.notes,
    )


def metrics(suite: SuiteRun | None, result: SuiteResult, smoke: SmokeDetails | SmokeNotConfigured, coverage: EntrypointCoverage | NoEntrypoint) -> list[Metric]:
    c = counts(result)
    found = [Metric(id="tests.suite", name="test_suite", value="not declared", note=NO_SUITE_NOTE)] if suite is None else [
        Metric(id="tests.collected", name="tests_collected", value=c.collected, note=f"{c.deselected} deselected" if c.deselected else ""),
        Metric(id="tests.passed", name="tests_passed", value=c.passed),
        Metric(id="tests.failed", name="tests_failed", value=c.failed),
        Metric(id="tests.errors", name="tests_errors", value=c.errors, note=f"{c.collection_errors} collection error(s)" if c.collection_errors else ""),
        Metric(id="tests.skipped", name="tests_skipped", value=c.skipped),
        Metric(id="tests.environment", name="tests_not_runnable_here", value=c.environment, note="failed for want of the network or a package (counted in tests_failed/tests_errors too)"),
        Metric(id="pytest.duration_s", name="pytest_duration_s", value=round(suite.child.duration_s, 3), unit="s", note="wall time of the pytest process, under coverage of the entrypoint's file"),
    ]
    for run in smoke.runs:
        if run.duration_s is not None:
            suffix = "" if run.label == "smoke" else "_" + run.label.replace("-", "_")
            found.append(Metric(id=f"smoke_call.duration_s.{run.label}", name=f"smoke_call{suffix}_s", value=run.duration_s, unit="s", note=f"setup + call; process wall {run.wall_s} s"))
    if isinstance(coverage, EntrypointCoverage) and coverage.executed_statements is not None:
        found.append(
            Metric(
                id="coverage.entrypoint_statements_executed",
                name="entrypoint_body_statements_executed",
                value=coverage.executed_statements,
                threshold=1,
                passed=coverage.executed_statements >= 1,
                note=f"of {coverage.body_statements} statements of {coverage.function}'s body, while the tests ran",
            )
        )
    return found


def summary(suite: SuiteRun | None, result: SuiteResult, smoke: SmokeDetails | SmokeNotConfigured, coverage: EntrypointCoverage | NoEntrypoint) -> str:
    c = counts(result)
    if suite is None:
        tests = "no test suite declared (tests = false): pytest not run"
    elif suite.child.timed_out:
        running = [t.nodeid for t in result.tests if t.outcome == "crashed"]
        tests = f"the test suite overran its budget after {suite.child.duration_s:.0f}s ({c.passed} passed before that" + (f"; {running[-1]} was still running)" if running else ")")
    else:
        tests = _suite_summary(suite, c)
    parts = [tests]
    if not smoke.configured:
        parts.append("no entrypoint configured")
    else:
        failed = [r for r in smoke.runs if not r.ok]
        parts.append(f"smoke call {failed[0].failure}" if failed else "smoke call ok")
    if isinstance(coverage, EntrypointCoverage) and coverage.executed_statements is not None:
        parts.append(f"tests execute {coverage.executed_statements}/{coverage.body_statements} entrypoint statements")
    return "; ".join(parts)


def _suite_summary(suite: SuiteRun, c: SuiteCounts) -> str:
    taken_out = "".join(f", {n} {k.replace('_', ' ')}" for k, n in (("xfailed", c.xfailed), ("xpassed", c.xpassed), ("deselected", c.deselected), ("not_run", c.not_run)) if n)
    tests = f"{c.passed} passed, {c.failed} failed, {c.errors} errors, {c.skipped} skipped{taken_out} of {c.collected} collected (pytest exit {suite.child.returncode})"
    if c.not_collected:
        tests += f", {c.not_collected} test file(s) or module(s) kept out of collection"
    if c.rewritten:
        tests += f"; {c.rewritten} outcome(s) rewritten by a hook (counted failed)"
    if c.collection_errors:
        tests += f", {c.collection_errors} collection error(s)"
    if c.environment or c.environment_modules:
        not_here = [f"{c.environment} test(s)"] if c.environment else []
        not_here += [f"{c.environment_modules} test module(s)"] if c.environment_modules else []
        tests += f"; suite incomplete: {' and '.join(not_here)} could not run here (network or missing package)"
    return tests
