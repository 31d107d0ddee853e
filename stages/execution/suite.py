"""Run the target's pytest suite in a child process and read back what happened.

The run is pinned to the target: `--rootdir` and `-c` (the target's own pytest
configuration, or an empty one) and `--confcutdir` keep any enclosing project's
configuration and conftest files out of it; the cache, the coverage data and pytest's
temporary folders go to the stage's scratch folder, never into the target. The request goes
on the child's stdin and the plugin's events come back over a pipe with this run's nonce
(`traingate.stages.common.channel`), so no test can find a file of events to rewrite.
The parsing half of this module is pure: it turns the plugin's events into outcomes, and
says where pytest's exit status and its events disagree (`inconsistencies`).
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
import tempfile
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from pydantic import BaseModel, ConfigDict, ValidationError

from traingate.stages.execution.details import SkipGroup, SuiteCounts
from traingate.pipeline.supervision.isolation import ChildResult, python_argv, run_child
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import StageContext
from traingate.stages.agent.pytest_config import find_pytest_config, testpaths_of
from traingate.stages.common.channel import ChannelError, ChannelSpec, new_nonce, read_records
from traingate.stages.contract.messages import PYTEST_EVENT, CoverageSpec, PytestRequest
from traingate.stages.contract.pytest_events import (
    PYTEST_EVENTS,
    CollectedEvent,
    CollectErrorEvent,
    CollectSkipEvent,
    ConftestErrorEvent,
    DeselectedEvent,
    DescribedException,
    EnvironmentCause,
    FinishEvent,
    FixtureRaised,
    IgnoredEvent,
    InternalErrorEvent,
    InterruptEvent,
    ItemRecord,
    ItemsEvent,
    OptionValue,
    PytestEvent,
    RaisedException,
    ReadsEvent,
    ReportEvent,
    SelectionEvent,
    SkipSite,
    StartEvent,
    TestStartEvent,
    SteppingEvent,
    TrainingEvent,
    WarningEvent,
    XdistDisabledEvent,
)
from traingate.pipeline.model.text import clip_line, first_line, strip_ansi

EXIT_MEANING = {
    0: "all tests passed",
    1: "tests failed",
    2: "interrupted",
    3: "internal error",
    4: "usage error",
    5: "no tests collected",
}


def exit_meaning(code: int, unknown: str) -> str:
    """What pytest means by an exit status; `unknown` for one pytest never uses."""
    return EXIT_MEANING.get(code, unknown)


# How reports show the run's private temporary folder (pytest's files), removed after the run.
PRIVATE_SHOWN = "<private temporary folder>"
RAN = ("passed", "failed", "error", "xfailed", "xpassed", "crashed", "interrupted")
FAILED = ("failed", "error", "crashed", "interrupted")


# -- running -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SuiteRun:
    """One pytest child run: what was asked, what the process did, what it handed back."""

    args: list[str]
    config_file: str | None  # relative to the target root; None when an empty one was used
    child: ChildResult
    events: list[PytestEvent]
    coverage_file: Path | None
    # Why the events cannot be trusted (a record without this run's nonce, out of sequence,
    # garbage on the channel); the events are then empty and the stage fails closed.
    channel_problem: str | None = None
    source: str = ""  # where the tests came from, as the report says it
    ended_at: float = 0.0  # the parent's wall clock (time.time()) when the process ended

    @property
    def command(self) -> str:
        return "python -m pytest " + shlex.join(self.args)


def pytest_args(ctx: StageContext, config_file: Path | None, private: Path, root: Path | None = None, tests: list[str] | None = None) -> list[str]:
    """The pytest arguments of a run of `tests` (the configured suite) pinned to `root` (the
    stage's); pytest's own files go to `private`, a neutral temporary folder (the tests can
    read these arguments: nothing in them may name the gate or its work folder)."""
    root = root or ctx.root
    if config_file is None:
        config_file = private / "pytest.ini"
        config_file.write_text("[pytest]\n")
    return [
        *(tests if tests is not None else ctx.config.tests or []),  # run only when a suite is declared
        f"--rootdir={root}",
        "-c", str(config_file),
        f"--confcutdir={root}",
        "-p", "no:cacheprovider",
        f"--basetemp={private / 'tmp'}",
        "--tb=short",
    ]


def run_suite(ctx: StageContext, name: str, coverage_include: list[str], root: Path | None = None, tests: list[str] | None = None) -> SuiteRun:
    """Run pytest on the target (or on `root`, another tree of it: the baseline's tests laid
    over this version's code) under the stage's remaining budget."""
    root = root or ctx.root
    ctx.scratch.mkdir(parents=True, exist_ok=True)
    private = Path(tempfile.mkdtemp())
    try:
        return _run_pytest(ctx, name, coverage_include, root, tests, private)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _suite_warm(ctx: StageContext) -> WarmPool | None:
    """The warm interpreters the suite's run forks from: those the smoke calls start (the same
    environment) when there are smoke calls, or the one the gate's agents' host handed down
    (with no entrypoint, for the stages that observe the tests' training). Otherwise none:
    alone, a suite that never imports torch would pay its import."""
    if ctx.warm is None or (ctx.config.entrypoint is None and not ctx.warm.handed_down):
        return None
    return ctx.warm


def _run_pytest(ctx: StageContext, name: str, coverage_include: list[str], root: Path, tests: list[str] | None, private: Path) -> SuiteRun:
    config_file = find_pytest_config(root, tests if tests is not None else ctx.config.tests or [])
    args = pytest_args(ctx, config_file, private, root, tests)
    coverage_file = private / "coverage" if coverage_include else None
    coverage = CoverageSpec(data_file=str(coverage_file), include=coverage_include) if coverage_file else None
    nonce = new_nonce()

    def request(fd: int) -> bytes:
        return PytestRequest(root=str(root), args=args, coverage=coverage, channel=ChannelSpec(fd=fd, nonce=nonce), read_at_start=ctx.read_at_start()).model_dump_json().encode()

    # For people reading the scratch folder; holds no nonce, never read back.
    (ctx.scratch / f"{name}.request.json").write_text(json.dumps({"root": str(root), "args": args, "coverage": coverage.model_dump() if coverage else None}, indent=1))
    env = ctx.child_env()
    child = run_child(
        python_argv("traingate.stages.execution.probe.pytest_launcher", disguise=ctx.disguise),
        cwd=root,
        budget_s=ctx.child_budget(),
        scratch=ctx.scratch,
        env=env,
        name=name,
        stdin_data=request,
        channel=True,
        warm=_suite_warm(ctx),
    )
    ended_at = time.time()
    try:
        events, problem = decode_events(child.channel, nonce), child.channel_problem
    except ChannelError as exc:
        events, problem = [], str(exc)
    if problem:
        events = []
    read_events = [e for e in events if isinstance(e, ReadsEvent)]
    ctx.files_read.append(read_events[-1].reads if len(read_events) == 1 else None)
    events = [e for e in events if not isinstance(e, ReadsEvent)]
    kept = ctx.scratch / f"{name}.coverage"
    if coverage_file is not None and coverage_file.is_file():
        shutil.move(coverage_file, kept)
    return SuiteRun(
        # The private folder is gone once the run is over: reports name it by what it was.
        args=[a.replace(str(private), PRIVATE_SHOWN) for a in args],
        config_file=config_file.relative_to(root).as_posix() if config_file else None,
        child=child,
        events=events,
        coverage_file=kept if kept.is_file() else None,
        channel_problem=problem,
        source=_source(ctx, tests, config_file, root),
        ended_at=ended_at,
    )


def _source(ctx: StageContext, tests: list[str] | None, config_file: Path | None, root: Path) -> str:
    """Where the run's tests came from: the arguments given, or pytest's own rules."""
    if tests is not None or ctx.config.tests:
        return f"the test paths given: {' '.join(tests if tests is not None else ctx.config.tests or [])}"
    where = config_file.relative_to(root).as_posix() if config_file else None
    testpaths = testpaths_of(config_file) if config_file else []
    if testpaths:
        return f"pytest's `testpaths` in {where}: {' '.join(testpaths)} (no `tests` configured)"
    return "pytest's own discovery from the repo's root (no `tests` configured, no `testpaths` set)"


def decode_events(data: bytes, nonce: str) -> list[PytestEvent]:
    """The plugin's events from the channel's bytes; a last record cut off by a dying process
    is dropped. ChannelError on any record the plugin did not write, or not in the shape it writes."""
    events: list[PytestEvent] = []
    for record in read_records(data, nonce, allow_cut_tail=True):
        if record.kind != PYTEST_EVENT:
            raise ChannelError(f"record {record.seq} is not a pytest event the plugin writes")
        try:
            events.append(PYTEST_EVENTS.validate_python(record.body))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(p) for p in error["loc"])
            raise ChannelError(f"record {record.seq} is not a pytest event the plugin writes: {where}: {error['msg']}") from None
    return events


# -- parsing -------------------------------------------------------------------------------


class PhaseRewrite(BaseModel):
    """A phase whose logged outcome is not what it did, as the gate saw it (`phase_rewrite`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    when: str
    did: str
    reported: str
    made: str | None  # the outcome pytest's own makereport made, before any wrapper
    raised: RaisedException | None


@dataclass
class TestOutcome:
    __test__ = False  # not a pytest test class
    nodeid: str
    outcome: str  # passed failed error skipped xfailed xpassed crashed interrupted
    duration_s: float = 0.0
    message: str = ""
    path: str | None = None  # the test's own location, relative to the target root
    line: int | None = None
    failure: DescribedException | None = None  # the failing phase's exception
    longrepr: str = ""
    skip: SkipSite | None = None
    # Each phase's report event as logged, with what the gate itself saw of the phase.
    phases: dict[str, ReportEvent] = field(default_factory=dict)
    # Phases whose logged outcome is not what the test did (`phase_rewrite`).
    rewrites: list[PhaseRewrite] = field(default_factory=list)
    optimizer_steps: int = 0  # the optimizer steps it made (`pytest_steps`)
    step_sites: list[str] = field(default_factory=list)  # where it made them, `path:line`, most first

    @property
    def environment(self) -> EnvironmentCause | None:
        """Why the test could not run in this environment, as the plugin classified its
        exception (network, missing-package); None for a failure of the code."""
        return self.failure.environment if self.failure is not None else None

    def phase(self, when: str) -> ReportEvent | None:
        return self.phases.get(when)


@dataclass
class SuiteResult:
    tests: list[TestOutcome] = field(default_factory=list)
    collected: int | None = None  # None: collection never finished
    deselected: int = 0
    collection_errors: list[CollectErrorEvent] = field(default_factory=list)
    conftest_error: ConftestErrorEvent | None = None
    warnings: list[WarningEvent] = field(default_factory=list)
    interrupt: InterruptEvent | None = None
    internal_error: InternalErrorEvent | None = None
    started: bool = False
    xdist_workers: int | str | None = None  # set when the target's own options spread its tests over xdist workers
    finished: bool = False
    exitstatus: int | None = None
    collected_ids: list[str] | None = None  # the node ids pytest collected, when it said
    stopped: str | None = None  # why pytest stopped before running every test (-x, --maxfail)
    # The accounting of `pytest_accounting`: what selected the run and what took tests out.
    selection: SelectionEvent | None = None
    xdist_disabled: XdistDisabledEvent | None = None
    ignored: list[IgnoredEvent] = field(default_factory=list)
    collect_skips: list[CollectSkipEvent] = field(default_factory=list)
    deselected_items: list[DeselectedEvent] = field(default_factory=list)
    items: dict[str, ItemRecord] = field(default_factory=dict)
    stepping: dict[str, SteppingEvent] = field(default_factory=dict)  # each test's latest `stepping` event

    def count(self, *outcomes: str) -> int:
        return sum(t.outcome in outcomes for t in self.tests)

    def environment_failures(self) -> list[TestOutcome]:
        """Failed tests that could not run here (network, missing package): not code defects."""
        return [t for t in self.tests if t.outcome in ("failed", "error") and t.environment is not None]

    def environment_collection_errors(self) -> list[CollectErrorEvent]:
        """Test modules that could not be imported here because their own import of a package
        that is not installed (or of the network) failed: limits of the environment, not code
        defects. Only where the failing line is in the test module itself."""
        return [e for e in self.collection_errors if e.environment is not None and e.target_frame is not None and e.target_frame.path == e.path]

    @property
    def effective_options(self) -> dict[str, OptionValue]:
        return self.selection.effective if self.selection is not None else {}

    def item(self, nodeid: str) -> ItemRecord | None:
        return self.items.get(nodeid)

    @property
    def ran(self) -> int:
        return self.count(*RAN)


def parse_events(events: list[PytestEvent]) -> SuiteResult:
    """Fold the events into one outcome per test.

    A test whose teardown was never reported did not finish: `interrupted` when pytest still
    reached its end (pytest.exit, KeyboardInterrupt), `crashed` when the process ended first.
    """
    result = SuiteResult()
    phases: OrderedDict[str, dict[str, ReportEvent]] = OrderedDict()
    places: dict[str, tuple[str | None, int | None]] = {}
    steps: dict[str, int] = {}
    sites: dict[str, list[str]] = {}
    for event in events:
        if isinstance(event, TestStartEvent):
            phases.setdefault(event.nodeid, {})
            places[event.nodeid] = (event.path, event.line)
        elif isinstance(event, ReportEvent):
            phases.setdefault(event.nodeid, {})[event.when] = event
        elif isinstance(event, TrainingEvent):
            steps[event.nodeid] = steps.get(event.nodeid, 0) + event.optimizer_steps
            sites[event.nodeid] = list(dict.fromkeys([*sites.get(event.nodeid, []), *event.sites]))
        elif isinstance(event, SteppingEvent):
            result.stepping[event.nodeid] = event  # its latest: read only if the suite was stopped
        else:
            _take_event(result, event)
    for nodeid, by_phase in phases.items():
        path, line = places.get(nodeid, (nodeid.split("::", 1)[0], None))
        result.tests.append(_fold(nodeid, by_phase, path, line, result.finished))
        result.tests[-1].optimizer_steps = steps.get(nodeid, 0)
        result.tests[-1].step_sites = sites.get(nodeid, [])
    return result


def _take_event(result: SuiteResult, event: PytestEvent) -> None:
    """Fold one event that is not about a single test's phases into the result."""
    match event:
        case StartEvent():
            result.started, result.xdist_workers = True, event.xdist_workers
        case ConftestErrorEvent():
            result.conftest_error = event
        case CollectErrorEvent():
            result.collection_errors.append(event)
        case CollectedEvent():
            result.collected, result.deselected = event.count, event.deselected
            result.collected_ids = list(event.nodeids) if event.nodeids is not None else None
        case WarningEvent():
            result.warnings.append(event)
        case InterruptEvent():
            result.interrupt = event
        case InternalErrorEvent():
            result.internal_error = event
        case FinishEvent():
            result.finished, result.exitstatus, result.stopped = True, event.exitstatus, event.stopped
        case SelectionEvent():
            result.selection = event
        case XdistDisabledEvent():
            result.xdist_disabled = event
        case IgnoredEvent():
            result.ignored.append(event)
        case CollectSkipEvent():
            result.collect_skips.append(event)
        case DeselectedEvent():
            result.deselected_items.append(event)
        case ItemsEvent():
            result.items.update((item.nodeid, item) for item in event.items)


def inconsistencies(run: SuiteRun, result: SuiteResult) -> list[tuple[str, str]]:
    """Where pytest's exit status and the events it handed back disagree, as (reason code,
    what): the events cannot be trusted then (a test wrote records of its own, or ended the
    process with a status of its choosing). Only for a run that reached pytest's end."""
    code = run.child.returncode
    if run.child.timed_out or not result.finished or code is None or code < 0:
        return []
    found: list[tuple[str, str]] = []
    # A test whose logged outcome a hook rewrote is counted failed by the gate, not by pytest:
    # it is left out where pytest's status is checked against the logged reports.
    rewritten = sum(bool(t.rewrites) for t in result.tests)
    failures = sum(t.outcome in FAILED and not t.rewrites for t in result.tests) + len(result.collection_errors) + (result.conftest_error is not None) + (result.internal_error is not None)
    if result.exitstatus != code:
        found.append(("pytest-exit-mismatch", f"pytest reported exit status {result.exitstatus} at its end, but its process exited with status {code}"))
    if code == 1 and failures == 0 and not rewritten:
        found.append(("exit-1-without-failures", "pytest exited with status 1 (tests failed), but no failure or error was recorded"))
    if code == 0 and failures:
        found.append(("exit-0-with-failures", f"pytest exited with status 0 (all tests passed), but {failures} failure(s) or error(s) were recorded"))
    listed_only = any(k in result.effective_options for k in ("collectonly", "setuponly", "setupplan", "showfixtures", "show_fixtures_per_test"))
    if result.collected_ids is not None and result.interrupt is None and not result.stopped and not result.xdist_workers and not listed_only:
        reported = {t.nodeid for t in result.tests}
        missing = [n for n in result.collected_ids if n not in reported]
        if missing:
            found.append(("collected-test-without-outcome", f"{len(missing)} collected test(s) have no outcome, e.g. {', '.join(missing[:5])}"))
        strangers = sorted(reported - set(result.collected_ids))
        if strangers:
            found.append(("outcome-of-uncollected-test", f"{len(strangers)} outcome(s) of tests pytest never collected, e.g. {', '.join(strangers[:5])}"))
    return found


def _fold(nodeid: str, by_phase: dict[str, ReportEvent], path: str | None, line: int | None, finished: bool) -> TestOutcome:
    """One test's outcome from its phases' reports: the one pytest logged, then whether the
    test finished, then what the gate saw of its reports being rewritten."""
    test = TestOutcome(nodeid=nodeid, outcome="passed", path=path, line=line, phases=by_phase)
    test.duration_s = round(sum(p.duration for p in by_phase.values()), 6)
    _logged_outcome(test)
    if test.phase("teardown") is None and test.outcome not in ("failed", "error"):
        test.outcome = "interrupted" if finished else "crashed"
        test.message = "the run stopped during this test" if finished else "the test process ended during this test"
    _observed_rewrites(test)
    return test


def _logged_outcome(test: TestOutcome) -> None:
    """The outcome pytest's reports give: a failed call, else a failed setup or teardown (an
    error), else a skip (or an expected failure), else an unexpected pass; passed otherwise."""
    setup, call, teardown = (test.phase(w) for w in ("setup", "call", "teardown"))
    failed = next(((when, p) for when, p in (("call", call), ("setup", setup), ("teardown", teardown)) if p is not None and p.outcome == "failed"), None)
    if failed is not None:
        when, phase = failed
        test.outcome = "failed" if when == "call" else "error"
        _take_failure(test, phase)
        return
    skipped = next((p for p in (call, setup) if p is not None and p.outcome == "skipped"), None)
    if skipped is not None and skipped.wasxfail is not None:
        test.outcome, test.message = "xfailed", skipped.wasxfail
    elif skipped is not None:
        test.outcome = "skipped"
        test.skip = skipped.skip
        test.message = skip_reason(test.skip.reason if test.skip is not None else None)
    elif call is not None and call.wasxfail is not None:
        test.outcome, test.message = "xpassed", call.wasxfail


def _observed_rewrites(test: TestOutcome) -> None:
    """The phases whose logged outcome is not what they did; where one is, the gate's own
    observation wins over the logged report: a test that otherwise passed did not."""
    test.rewrites = [r for when in ("setup", "call", "teardown") if (r := phase_rewrite(when, test.phase(when))) is not None]
    if test.rewrites and test.outcome not in ("failed", "error", "crashed", "interrupted"):
        first = test.rewrites[0]
        test.outcome = "failed" if first.when == "call" else "error"
        test.message = clip_line(f"{first.did}, but its {first.when} report says {first.reported}", 500)


def phase_rewrite(when: str, phase: ReportEvent | None) -> PhaseRewrite | None:
    """Where the outcome pytest logged for a phase is not what the phase did, as the gate's
    plugin saw it from outside every hook: an exception the test (or a fixture) raised, a test
    function never called, a phase that never ran, or a status hook that calls a failure
    something else. None when they agree (or no report was logged for the phase)."""
    if phase is None:
        return None
    reported, observed = phase.outcome, phase.observed
    xfailed = phase.wasxfail is not None
    did: str | None = None
    if observed is None and reported == "passed":
        did = f"the gate saw no {when} phase run"
    elif observed is not None:
        raised = observed.raised or (observed.fixture_raised if when == "setup" else None)
        if observed.called is False and reported == "passed":
            did = "the test function was never called"
        elif raised is not None and _contradicts(raised.kind, reported, xfailed):
            what = f"{raised.type}: {first_line(raised.message, 200)}".rstrip(": ")
            did = f"the {'fixture ' + repr(raised.fixture) if isinstance(raised, FixtureRaised) else 'test'} raised {what}"
    if did is None and phase.teststatus not in (None, "failed", "error") and reported == "failed":
        did, reported = "the test failed", f"{phase.teststatus} (pytest_report_teststatus)"
    if did is None:
        return None
    return PhaseRewrite(when=when, did=did, reported=reported + (" (xfail)" if xfailed else ""), made=phase.made_outcome, raised=observed.raised if observed else None)


def _contradicts(kind: str, reported: str, xfailed: bool) -> bool:
    """Whether a phase that raised an exception of `kind` may not be logged as `reported`."""
    if kind == "other":
        return reported == "passed" or (reported == "skipped" and not xfailed)
    if kind in ("skip", "xfail"):
        return reported == "passed"
    return False


def _take_failure(test: TestOutcome, phase: ReportEvent) -> None:
    failure = phase.failure
    test.failure = failure
    test.longrepr = phase.longrepr
    if failure is not None:
        # One line: the message labels the test in tables and titles; the traceback has the rest.
        test.message = clip_line(f"{failure.type}: {first_line(failure.message, 500)}".strip().rstrip(":"), 500)
    else:
        lines = [ln for ln in strip_ansi(test.longrepr).splitlines() if ln.startswith("E ")]
        test.message = clip_line(lines[-1][1:].strip() if lines else (test.longrepr.strip().splitlines() or [""])[-1], 500)


def skip_reason(reason: str | None) -> str:
    """The reason as a reader wrote it: pytest prefixes `Skipped: `."""
    reason = (reason or "").strip()
    if reason.startswith("Skipped:"):
        reason = reason[len("Skipped:"):].strip()
    return reason or "no reason given"


def group_skips(tests: list[TestOutcome]) -> list[SkipGroup]:
    """Skipped tests grouped by reason, the largest group first."""
    groups: OrderedDict[str, list[TestOutcome]] = OrderedDict()
    for test in tests:
        if test.outcome == "skipped":
            groups.setdefault(test.message or "no reason given", []).append(test)
    found = []
    for reason, members in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        first, skip = members[0], members[0].skip
        path, line = (skip.path, skip.line) if skip is not None else (None, None)
        found.append(SkipGroup(reason=reason, count=len(members), tests=[t.nodeid for t in members], path=path or first.path, line=line or first.line))
    return found


def counts(result: SuiteResult) -> SuiteCounts:
    # Deselected tests were collected too (pytest counts them so); a hook that drops tests
    # without saying so is counted here as well, from the gate's own record of them.
    deselected = max(result.deselected, len(result.deselected_items))
    selected = result.collected if result.collected is not None else len(result.tests)
    return SuiteCounts(
        collected=selected + deselected,
        deselected=deselected,
        not_collected=len(result.ignored) + len(result.collect_skips),
        rewritten=sum(bool(t.rewrites) for t in result.tests),
        not_run=len(set(result.collected_ids or []) - {t.nodeid for t in result.tests}),
        passed=result.count("passed"),
        failed=result.count("failed", "crashed", "interrupted"),
        errors=result.count("error"),
        skipped=result.count("skipped"),
        xfailed=result.count("xfailed"),
        xpassed=result.count("xpassed"),
        collection_errors=len(result.collection_errors) + (1 if result.conftest_error else 0),
        environment=len(result.environment_failures()),
        environment_modules=len(result.environment_collection_errors()),
    )
