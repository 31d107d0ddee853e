"""Findings about the test suite: what pytest ran, failed, could not collect, or skipped.

Each check states its category. Everything here reads a finished `SuiteRun` (the child's
exit status and the plugin's events); nothing runs target code. Where the run left no
record of a test having run, the stage fails closed with `no-tests`.
"""

from __future__ import annotations

from pathlib import Path
from traingate.stages.common.stacks import crash_frames
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.pipeline.model.findings import budget_overrun, progressing, stopped_finding
from traingate.stages.base import StageContext, hang_finding, innermost_target_frame
from traingate.stages.contract.pytest_events import CollectErrorEvent, EnvironmentCause, InternalErrorEvent, MissingPackage
from traingate.pipeline.model.text import clip_line, clip_text, first_line
from traingate.stages.agent.environment import environment_finding, missing_module
from traingate.stages.execution.accounting import site_location
from traingate.stages.execution.suite import SuiteResult, SuiteRun, TestOutcome, exit_meaning, group_skips, inconsistencies
from traingate.stages.execution.rules import COLLECTION_ERROR, NO_TESTS, SKIPPED_TESTS, TEST_ENVIRONMENT, TEST_FAILURE
from traingate.stages.execution.config import ExecutionPolicy

_TAIL = 6000


def suite_findings(ctx: StageContext, run: SuiteRun, result: SuiteResult, hidden: frozenset[str] = frozenset()) -> list[Finding]:
    """All findings about the test run, the most specific first; `no-tests` only when
    nothing more specific explains why no test ran. `hidden`: skipped tests the accounting
    reports on their own (a hook's skip), left out of the plain skip groups."""
    findings: list[Finding] = untrusted_events(ctx, run, result)
    if run.child.timed_out:
        findings.append(_stopped_suite(ctx, run, result))
    findings += conftest_errors(ctx, run, result)
    findings += collection_errors(ctx, result)
    findings += test_failures(ctx, run, result)
    findings += abnormal_ends(ctx, run, result)
    if not any(f.blocking for f in findings):
        findings += no_tests(ctx, run, result)
    findings += skipped_tests(ctx, result, hidden)
    return findings


def untrusted_events(ctx: StageContext, run: SuiteRun, result: SuiteResult) -> list[Finding]:
    """`stage-error`: what the test run handed back cannot be believed — records on the events
    channel that traingate's plugin did not write, or an exit status that contradicts the
    events (checked from outside the test process, where no test can reach)."""
    if run.channel_problem:
        problems = [("untrusted-events", f"the test run's event channel holds records traingate's plugin did not write: {run.channel_problem}")]
    else:
        problems = inconsistencies(run, result)
    return [
        ctx.stage_error(
            what,
            reason=reason,
            child=run.child,
            problem=f"{what[:1].upper() + what[1:]}. The test results of this run cannot be trusted, so none of them counts as a pass.",
            fix="Look for a test, fixture or conftest that writes to file descriptors it did not open, ends the process itself (os._exit), or changes pytest's exit status; if none does, report it with this report.json.",
            data={"exit_status": run.child.returncode, "command": run.command},
        )
        for reason, what in problems
    ]


def _stopped_suite(ctx: StageContext, run: SuiteRun, result: SuiteResult) -> Finding:
    """`hang` for a suite that stopped making progress; `budget-overrun` for one that ran tests
    until its budget ended, with how far it got and what it did not reach."""
    running = [t for t in result.tests if t.outcome == "crashed"]
    done = [t for t in result.tests if t.outcome not in ("crashed", "interrupted", "not-run", "deselected", "not-collected")]
    waited = max(0.0, run.child.duration_s - sum(t.duration_s for t in done))
    what = "The test suite" + (f" (in {running[-1].nodeid})" if running else "")
    stepping = result.stepping.get(running[-1].nodeid) if running else None
    if stepping is not None and run.ended_at and progressing(run.ended_at - stepping.at, run.child.duration_s):
        # A long test that trains: still stepping when the budget ended, so still progressing.
        return stopped_finding(ctx, run.child, what, run="pytest", key=running[-1].nodeid, progress=(stepping.optimizer_steps, run.ended_at - stepping.at),
                               fix=f"Raise `timeout_s` (now {ctx.config.timeout_s:.0f}) so the suite's training tests fit, or set `tests` to the paths that verify the training quickly.")
    if not done or not progressing(waited, run.child.duration_s):
        return hang_finding(ctx, run.child, what, run="pytest", key=running[-1].nodeid if running else "")
    collected = result.collected if result.collected is not None else len(result.tests)
    finished = {t.nodeid for t in done}
    left = [n for n in (result.collected_ids or []) if n not in finished]
    return budget_overrun(
        ctx, "The test suite", run="pytest",
        problem=(
            f"The suite ran {len(done)} of {collected} collected test(s) in {run.child.duration_s:.0f}s and was still running tests when the stage's budget "
            f"({ctx.config.timeout_s:.0f}s, `timeout_s`) ended" + (f", in {running[-1].nodeid} for the last {waited:.0f}s" if running else "")
            + f". Not reached: {len(left)} test(s)" + (f", e.g. {', '.join(left[:3])}" if left else "") + "."
        ),
        summary=f"{len(done)} of {collected} test(s) finished; stopped at {run.child.duration_s:.0f}s",
        stacks=run.child.stacks, data={"finished": len(done), "collected": collected, "not_reached": left[:50], "budget_s": ctx.config.timeout_s},
        fix=f"Raise `timeout_s` (now {ctx.config.timeout_s:.0f}) so the suite fits, or set `tests` to the paths that verify the training.",
    )


def conftest_errors(ctx: StageContext, run: SuiteRun, result: SuiteResult) -> list[Finding]:
    """`collection-error`: a conftest that cannot be imported stops the whole suite.

    pytest answers with a usage error (exit status 4) and runs nothing.
    """
    err = result.conftest_error
    if err is None:
        return []
    conftest = _relative(err.conftest, ctx.root)
    location = site_location(err.target_frame) or (Location(path=conftest, line=None) if conftest else None)
    if (missing := missing_module(ctx.root, err)) is not None:  # a package not installed here
        return [environment_finding(ctx, err, missing, f"Importing {conftest or 'a conftest'}", location, run="conftest")]
    return [
        ctx.finding(
            category=COLLECTION_ERROR,
            severity=Severity.CRITICAL,
            title=f"conftest {conftest or ''} cannot be imported: {err.type}".replace("  ", " "),
            location=location,
            problem=f"Importing {conftest or 'a conftest'} raised {err.type}: {_first_line(err.message)}; pytest stopped before collecting any test (exit status {run.child.returncode}).",
            impact="No test of the suite ran, so nothing about this version was verified by its tests.",
            fix="Make the conftest importable in a clean environment (missing dependency, wrong import path, code that needs a GPU or network at import).",
            evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{err.type} while loading {conftest}", traceback=err.traceback or _tail(run.child.stderr), data={"exit_status": run.child.returncode}),
            key=f"conftest {conftest} {err.type}",
        )
    ]


def collection_errors(ctx: StageContext, result: SuiteResult) -> list[Finding]:
    """`collection-error`: a test module (or package) that could not be imported or collected.

    Located at the innermost frame of the target's code in the import error, often a line
    of a module the test imports rather than the test file itself.
    """
    findings = []
    not_run = f" pytest stops before running any test when collection fails: none of the {result.collected or 0} collected test(s) ran." if result.ran == 0 else ""
    environmental = result.environment_collection_errors()
    for err in result.collection_errors:
        module = err.path or err.nodeid or "?"
        location = site_location(err.target_frame) or Location(path=module, line=None)
        if any(err is env_err for env_err in environmental):
            # A test module that itself imports a package this environment lacks (`from
            # transformers import ...` at its top) is a limit of the runner, like a test that
            # needs the network. The same import in the target's own code, reached through
            # the test module, cannot load: an `environment` finding, blocking, below.
            findings.append(_environment_module(ctx, err, module, location, not_run))
            continue
        if (missing := missing_module(ctx.root, err)) is not None:  # the target's code imports a package not installed here
            findings.append(environment_finding(ctx, err, missing, f"Collecting {module}", location, run="collection"))
            continue
        what = err.type or "an error"
        message = _first_line(err.message) or _first_line(err.longrepr)
        findings.append(
            ctx.finding(
                category=COLLECTION_ERROR,
                severity=Severity.HIGH,
                title=f"{module} cannot be collected: {what}",
                location=location,
                problem=f"Collecting {module} raised {what}: {message}.{not_run}",
                fix=f"Fix the error at {location.path}{':' + str(location.line) if location.line else ''} so the module imports in a clean environment.",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{what} while collecting {module}", traceback=err.traceback or err.longrepr, data={"nodeid": err.nodeid}),
                key=f"{module} {what}",
            )
        )
    return findings


def test_failures(ctx: StageContext, run: SuiteRun, result: SuiteResult) -> list[Finding]:
    """`test-failure`: a test that failed, errored in a fixture, or ended the process.

    Located at the innermost frame of the target's code in the failure's traceback: the
    failing assert in the test, or the target line a test called into that raised.
    """
    findings = []
    for test in result.tests:
        if test.outcome not in ("failed", "error", "crashed", "interrupted"):
            continue
        if test.outcome == "crashed" and run.child.timed_out:
            continue  # the hang finding carries this test's stacks
        if test.environment is not None:
            findings.append(environment_failure(ctx, run, test))
            continue
        location, evidence = _failure_site(ctx, run, test)
        verb = {"failed": "fails", "error": "errors", "crashed": "kills the test process", "interrupted": "stops the test run"}[test.outcome]
        findings.append(
            ctx.finding(
                category=TEST_FAILURE,
                severity=Severity.HIGH,
                title=f"{test.nodeid} {verb}",
                location=location,
                problem=f"{test.nodeid} {verb}: {_full_message(test)}",
                fix="Run `python -m pytest " + test.nodeid + "` locally and fix the code or the test it points at.",
                evidence=evidence,
                key=test.nodeid,
            )
        )
    return findings


def environment_failure(ctx: StageContext, run: SuiteRun, test: TestOutcome) -> Finding:
    """`test-environment`: a test that failed because this environment lacks the network or a
    package. Low severity unless the policy's `test_environment_blocks` says it blocks; the
    stage's summary counts these tests as not run here."""
    env = test.environment
    assert env is not None  # only tests that failed for want of the environment come here
    location, evidence = _failure_site(ctx, run, test)
    evidence = evidence.model_copy(update={"data": {**evidence.data, "environment": env.model_dump()}})
    need, key = _environment_need(env)
    if not isinstance(env, MissingPackage):
        fix = (
            "Mark the test (for example `@pytest.mark.network`, registered in the pytest configuration) and deselect it in "
            "`tests` (`tests = [\"tests\", \"-m\", \"not network\"]`), or give it a local stand-in for the remote resource."
        )
    else:
        fix = (
            f"Install {env.package!r} in the CI environment if the test must run there; otherwise skip it when the package is missing "
            f"(`pytest.importorskip({env.package!r})`) or deselect it in `tests`."
        )
    blocks = ctx.thresholds(ExecutionPolicy).test_environment_blocks
    return ctx.finding(
        category=TEST_ENVIRONMENT,
        severity=Severity.HIGH if blocks else Severity.LOW,
        title=f"{test.nodeid} could not run here: it needs {_needed(env, key)}",
        location=location,
        problem=f"{test.nodeid} failed because it needs {need}: {test.message or 'no message'}. This is a limit of the environment the gate ran in, not a defect it found in the code.",
        impact="What this test checks was not verified in this run; the suite was incomplete." + (" The policy (`test_environment_blocks = true`) blocks on it." if blocks else ""),
        fix=fix,
        evidence=evidence,
        key=f"{test.nodeid} {key}",
    )


def _environment_module(ctx: StageContext, err: CollectErrorEvent, module: str, location: Location, not_run: str) -> Finding:
    """`test-environment` for a test module that could not be imported here. pytest then runs
    no test at all, so `no-tests` still blocks when nothing else ran: an incomplete suite
    verified nothing."""
    env = err.environment
    assert env is not None  # only modules that failed for want of the environment come here
    need, key = _environment_need(env)
    leave_out = f"or leave the module out (`tests = [\"tests\", \"--ignore={module}\"]`)"
    if not isinstance(env, MissingPackage):
        fix = f"Move the network access out of import time (into a test marked and deselected with `-m \"not network\"`), {leave_out}."
    else:
        package = env.package
        fix = (
            f"Install {package!r} in the CI environment if these tests must run there; otherwise make the module skip without it "
            f"(`{package} = pytest.importorskip({package!r})` in place of the import) {leave_out}."
        )
    blocks = ctx.thresholds(ExecutionPolicy).test_environment_blocks
    message = _first_line(err.message) or _first_line(err.longrepr)
    return ctx.finding(
        category=TEST_ENVIRONMENT,
        severity=Severity.HIGH if blocks else Severity.LOW,
        title=f"{module} could not be imported here: it needs {_needed(env, key)}",
        location=location,
        problem=(
            f"Collecting {module} raised {err.type or 'an error'} ({message}): it needs {need}. "
            f"This is a limit of the environment the gate ran in, not a defect it found in the code.{not_run}"
        ),
        impact="What the tests of this module check was not verified in this run; the suite was incomplete." + (" The policy (`test_environment_blocks = true`) blocks on it." if blocks else ""),
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{err.type} while collecting {module}",
            traceback=err.traceback or err.longrepr,
            data={"nodeid": err.nodeid, "environment": env.model_dump()},
        ),
        key=f"{module} {key}",
    )


def _environment_need(env: EnvironmentCause) -> tuple[str, str]:
    """What the environment lacked, in words, and the finding key's part for it."""
    if isinstance(env, MissingPackage):
        return f"the package {env.package!r} (import of {env.module!r}), which is not installed here", f"missing-package {env.package}"
    return f"the network ({env.type})", "network"


def _needed(env: EnvironmentCause, key: str) -> str:
    return repr(env.package) if isinstance(env, MissingPackage) else "the network"


def _failure_site(ctx: StageContext, run: SuiteRun, test: TestOutcome) -> tuple[Location | None, Evidence]:
    own = Location(path=test.path, line=test.line, function=test.nodeid.split("::")[-1].split("[")[0]) if test.path else None
    if test.outcome in ("crashed", "interrupted"):
        frames = crash_frames(run.child.stacks)
        location = innermost_target_frame(frames, ctx.root) or own
        exit_desc = run.child.signal_name or f"exit status {run.child.returncode}"
        return location, Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"the pytest process ended ({exit_desc}) while {test.nodeid} was running" if test.outcome == "crashed" else f"pytest stopped (exit status {run.child.returncode}) while {test.nodeid} was running",
            traceback=(run.child.stacks[-_TAIL:] if frames else _tail(run.child.stdout + run.child.stderr)) or None,
            data={"exit_status": run.child.returncode, "signal": run.child.signal_name},
        )
    frame = test.failure.target_frame if test.failure is not None else None
    location = site_location(frame) or own
    return location, Evidence(
        kind=EvidenceKind.OBSERVED,
        summary=clip_line(f"{test.outcome}: {first_line(test.message, 300)}", 300),
        traceback=test.longrepr or (test.failure.traceback if test.failure is not None else None) or None,
        data={"nodeid": test.nodeid, "outcome": test.outcome, "duration_s": test.duration_s, "code": frame.code if frame is not None else None},
    )


def abnormal_ends(ctx: StageContext, run: SuiteRun, result: SuiteResult) -> list[Finding]:
    """A run that ended outside its tests: an internal error, a usage error, a pytest.exit()
    from a hook, or a process that died between tests. Always blocking (fail closed)."""
    if run.child.timed_out or result.conftest_error is not None:
        return []
    code = run.child.returncode
    stopped_in_test = any(t.outcome in ("crashed", "interrupted") for t in result.tests)
    if result.internal_error is not None:
        return [_internal_error(ctx, run, result.internal_error)]
    if code == 4 and not _missing_paths(run):
        return [_usage_error(ctx, run)]
    if stopped_in_test:
        return []
    if result.interrupt is not None and result.ran > 0:
        return [_ended_early(ctx, run, result, site_location(result.interrupt.target_frame), f"pytest was stopped ({result.interrupt.type}: {_first_line(result.interrupt.message)})")]
    if not result.finished and result.ran > 0:
        frames = crash_frames(run.child.stacks)
        what = run.child.signal_name or f"exit status {code}"
        return [_ended_early(ctx, run, result, innermost_target_frame(frames, ctx.root), f"the pytest process ended ({what}) before pytest finished")]
    if code not in (0, 1, 2, 5) and code is not None and code >= 0 and result.ran > 0:
        return [_ended_early(ctx, run, result, None, f"pytest exited with status {code}, which pytest itself never uses")]
    return []


def _internal_error(ctx: StageContext, run: SuiteRun, err: InternalErrorEvent) -> Finding:
    location = site_location(err.target_frame)
    title = f"pytest stopped with an internal error: {err.type}"
    problem = f"pytest reported an internal error (exit status {run.child.returncode}): {err.type}: {_first_line(err.message)}."
    impact = "The suite did not run to its end; its results cannot be trusted."
    evidence = Evidence(kind=EvidenceKind.OBSERVED, summary=f"exit status {run.child.returncode} ({exit_meaning(run.child.returncode or 0, '?')})", traceback=err.traceback or _tail(run.child.stderr), data={"exit_status": run.child.returncode, "command": run.command})
    if location is None:
        # pytest (or traingate's plugin) broke: the stage cannot vouch for anything.
        fix = "Run the same command by hand; if pytest itself breaks, report it with this report.json."
        return ctx.stage_error(title, reason="pytest-internal-error", key=err.type, title=title, problem=problem, impact=impact, fix=fix, evidence=evidence)
    # Raised from the target's own hooks: its suite cannot be collected or run.
    return ctx.finding(
        category=COLLECTION_ERROR,
        severity=Severity.CRITICAL,
        title=title,
        location=location,
        problem=problem,
        impact=impact,
        fix="Read the traceback: an exception raised in a conftest hook or a plugin stops pytest this way.",
        evidence=evidence,
        key=f"internal error {err.type}",
    )


def _usage_error(ctx: StageContext, run: SuiteRun) -> Finding:
    message = _usage_message(run)
    return ctx.stage_error(
        "pytest refused the suite's arguments",
        reason="pytest-usage-error",
        title=f"pytest refused the suite's arguments: {message[:120]}",
        problem=f"pytest ended with a usage error (exit status 4): {message}. The arguments came from `tests` in the traingate configuration and the target's own pytest configuration ({run.config_file or 'none'}).",
        impact="No test ran, so nothing about this version was verified by its tests.",
        fix="Correct `tests` in [tool.traingate], or the target's pytest options (an `addopts` that needs a plugin not installed is a common cause).",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="exit status 4 (usage error)", traceback=_tail(run.child.stderr + run.child.stdout) or None, data={"command": run.command}),
    )


def _ended_early(ctx: StageContext, run: SuiteRun, result: SuiteResult, location: Location | None, why: str) -> Finding:
    total = result.collected if result.collected is not None else len(result.tests)
    never = never_ran(result)
    named = f"; never ran: {_named_tests(never)}" if never else ""
    return ctx.finding(
        category=TEST_FAILURE,
        severity=Severity.HIGH,
        title=clip_line(f"The test run ended early: {result.ran} of {total} tests ran{named}", 300),
        location=location,
        problem=f"{why}, after {result.ran} of {total} collected tests had run." + (f" {len(never)} collected test(s) never ran: {_named_tests(never, 200)}." if never else ""),
        impact="The tests that did not run verified nothing; a green exit status here would be a false pass.",
        fix="Find what ends the run (a hook calling pytest.exit, a test or fixture that exits the process) and let the suite finish.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=why, traceback=(run.child.stacks[-_TAIL:] or _tail(run.child.stderr)) or None, data={"exit_status": run.child.returncode, "ran": result.ran, "collected": total, "never_ran": never[:500]}),
        key="run-ended-early",
    )


def never_ran(result: SuiteResult) -> list[str]:
    """The collected tests pytest reported nothing of, in collection order."""
    reported = {t.nodeid for t in result.tests}
    return [n for n in result.collected_ids or [] if n not in reported]


def _named_tests(nodeids: list[str], most: int = 5) -> str:
    shown = ", ".join(nodeids[:most])
    return shown + (f" and {len(nodeids) - most} more" if len(nodeids) > most else "")


def no_tests(ctx: StageContext, run: SuiteRun, result: SuiteResult) -> list[Finding]:
    """`no-tests`: no test ran — none collected, all deselected, all skipped, or a pytest
    that ended (even with status 0) without a record of any test. Blocking: a suite that
    ran nothing verified nothing."""
    environment = len(result.environment_failures())
    if run.child.timed_out or result.ran - environment > 0:
        return []
    code = run.child.returncode
    modules = [e.path or e.nodeid for e in result.environment_collection_errors()]
    if modules and result.ran == 0:
        why = (
            f"{len(modules)} test module(s) could not be imported here ({', '.join(modules[:5])}: a package that is not installed, or the network), "
            "and pytest runs no test when a module cannot be collected"
        )
    elif environment:
        why = f"every test that ran ({environment}) could not run here: it needed the network or a package that is not installed"
    elif _missing_paths(run):
        why = f"pytest found none of the test paths ({_usage_message(run)})"
    elif not result.started:
        why = f"pytest exited with status {code} before its session started: nothing was collected or reported"
    elif not result.finished:
        why = f"the pytest process ended ({run.child.signal_name or f'exit status {code}'}) before it reported any test"
    elif result.interrupt is not None:
        why = f"pytest was stopped before any test ran ({result.interrupt.type}: {_first_line(result.interrupt.message)}; exit status {code})"
    elif result.collected == 0 and result.deselected:
        why = f"all {result.deselected} collected tests were deselected"
    elif result.collected == 0 or not result.tests:
        why = f"pytest collected no tests (exit status {code}: {exit_meaning(code or 0, 'unknown')})"
    else:
        why = f"all {result.count('skipped')} tests were skipped"
    location = site_location(result.interrupt.target_frame if result.interrupt is not None else None)
    return [
        ctx.finding(
            category=NO_TESTS,
            severity=Severity.HIGH,
            title="No test ran",
            location=location,
            problem=f"No test ran: {why}. Command: `{run.command}` in the target root.",
            fix=(
                "Leave out the modules that cannot be imported here, or make them skip without what they need (the `test-environment` findings say how), so the rest of the suite runs."
                if modules and result.ran == 0
                else f"Make sure the suite the gate ran ({ctx.config.tests_described()}) holds tests pytest collects and that nothing ends or empties the run: set `tests` to the test paths, or `tests = false` for a repo without a test suite."
            ),
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=why,
                traceback=_tail(run.child.stdout + "\n" + run.child.stderr) or None,
                data={"exit_status": code, "collected": result.collected, "deselected": result.deselected, "skipped": result.count("skipped"), "events": len(run.events)},
            ),
            key="no-tests",
        )
    ]


NO_SUITE_NOTE = "no test suite declared: the configuration says `tests = false`, so pytest was not run and nothing here was verified by tests"


def no_suite_finding(ctx: StageContext) -> Finding:
    """`no-tests`, at info severity: the repo declares that it has no test suite. Not a
    defect the gate can hold against this version, but every report must show that no test
    verified it; a policy that blocks on `info` blocks on it."""
    return ctx.finding(
        category=NO_TESTS,
        severity=Severity.INFO,
        title="No test suite declared (`tests = false`): pytest was not run",
        location=None,
        problem="The traingate configuration declares that this repo has no test suite (`tests = false`); pytest was not run. The smoke call and the other stages still ran.",
        impact="Nothing about this version was verified by tests; only the smoke call and the other stages' checks stand behind the decision.",
        fix="Add a test suite and set `tests` to its pytest arguments (for example `tests = [\"tests\"]`).",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="no test suite declared", data={"tests": False}),
        key="no-suite-declared",
    )


def skipped_tests(ctx: StageContext, result: SuiteResult, hidden: frozenset[str] = frozenset()) -> list[Finding]:
    """`skipped-tests`: one finding per skip reason, with the tests that share it.

    Not a defect by itself (CUDA-only tests on a CPU runner), but a reader must see what
    was not verified here; low severity, so the policy's defaults never block on it.
    """
    findings = []
    for group in group_skips([t for t in result.tests if t.nodeid not in hidden]):
        findings.append(
            ctx.finding(
                category=SKIPPED_TESTS,
                severity=Severity.LOW,
                title=f"{group.count} test(s) skipped: {group.reason}",
                location=Location(path=group.path, line=group.line) if group.path else None,
                problem=f"{group.count} test(s) were skipped with the reason \"{group.reason}\"; what they check was not verified in this run.",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=f"{group.count} skipped: {group.reason}", data={"tests": group.tests[:100]}),
                key=f"skipped {group.reason}",
            )
        )
    return findings


def _missing_paths(run: SuiteRun) -> bool:
    return run.child.returncode == 4 and "file or directory not found" in (run.child.stderr + run.child.stdout)


def _usage_message(run: SuiteRun) -> str:
    """pytest's own complaint: `prog: error: ...` from argparse, else its `ERROR: ...` line."""
    lines = (run.child.stderr + "\n" + run.child.stdout).splitlines()
    for line in lines:
        if ": error:" in line:
            return line.split(": error:", 1)[1].strip()
    for line in lines:
        if line.startswith("ERROR:") and not line.startswith("ERROR: usage:"):
            return line.removeprefix("ERROR:").strip()
    return _first_line(run.child.stderr) or "no message"


def _full_message(test: TestOutcome) -> str:
    """The failure's message in whole lines (a multi-line assertion diff stays readable), cut
    at a line boundary with the number of lines left out; the traceback holds all of it."""
    failure = test.failure
    if failure is None or not failure.message:
        return f"{test.message or 'no message'}."
    return f"{failure.type}: " + clip_text(failure.message, 800, max_lines=12)


def _first_line(text: str | None) -> str:
    return first_line(str(text or ""), 300)


def _tail(text: str) -> str:
    return text[-_TAIL:].strip()


def _relative(path: str, root: Path) -> str:
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path
