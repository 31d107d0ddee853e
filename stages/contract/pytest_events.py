"""The events the pytest plugin hands back over the channel, one model per kind.

`stages/execution/probe/pytest_plugin.py` (`EventRecorder`) and `pytest_accounting`
(`TestAccountant`) build them in the pytest child; `stages/execution/suite.py` validates
every record against `PytestEvent` (discriminated by `event`) and reads the models. A record
that does not validate is a channel problem: the stage fails closed.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, TypeAdapter

from .messages import Strict, TargetFrame
from ..common.reads import FilesRead

# -- parts ---------------------------------------------------------------------------------


class NetworkCause(Strict):
    """The failure was the network's: it could not be reached from here."""

    kind: Literal["network"]
    type: str  # module-qualified class of the exception that says so
    detail: str


class MissingPackage(Strict):
    """The failure was an import of a package that is not installed here (and not the target's)."""

    kind: Literal["missing-package"]
    module: str
    package: str
    detail: str


EnvironmentCause = Annotated[NetworkCause | MissingPackage, Field(discriminator="kind")]


class DescribedException(Strict):
    """An exception raised in the pytest child: type, message, traceback text, the innermost
    frame in the target's code, and why it is the environment's failure, when it is."""

    type: str
    message: str
    traceback: str
    target_frame: TargetFrame | None
    environment: EnvironmentCause | None


class RaisedException(Strict):
    """An exception the gate saw a phase raise, from outside every hook."""

    type: str
    message: str
    kind: Literal["skip", "xfail", "exit", "other"]
    by_marker: bool  # raised by pytest's skipping plugin for a mark, not by a call in the code
    site: TargetFrame | None


class FixtureRaised(RaisedException):
    fixture: str  # the fixture's name


class PhaseObservation(Strict):
    """What the gate saw of one phase: it ran, what it raised, whether the test function was called."""

    ran: bool
    raised: RaisedException | None
    called: bool | None  # None: the phase calls no test function, or one the gate does not wrap
    raised_in_function: bool = False
    fixture_raised: FixtureRaised | None = None


class SkipSite(Strict):
    path: str
    line: int | None
    reason: str


class TargetHook(Strict):
    """An implementation of a watched hook in the target's own files."""

    hook: str
    path: str
    line: int
    wrapper: bool


class MarkRecord(Strict):
    name: str  # skip, skipif, xfail
    reason: str
    strict: bool | None  # xfail only
    declared: bool  # the source declares it (else a hook added it)
    site: TargetFrame | None  # where a hook added it, when it used add_marker


class ItemRecord(Strict):
    nodeid: str
    path: str
    line: int | None
    source_hash: str | None
    marks: list[MarkRecord]


OptionValue = bool | int | str | list[str]

# -- events of EventRecorder ---------------------------------------------------------------


class ConftestErrorEvent(DescribedException):
    event: Literal["conftest_error"] = "conftest_error"
    conftest: str


class StartEvent(Strict):
    event: Literal["start"] = "start"
    pytest: str
    rootdir: str
    inifile: str | None
    args: list[str]
    pid: int
    xdist_workers: int | str | None  # set when the target's own options spread its tests over xdist


class CollectErrorEvent(Strict):
    """A module or package that could not be collected; the exception, when pytest kept it."""

    event: Literal["collect_error"] = "collect_error"
    nodeid: str
    path: str
    longrepr: str
    type: str | None = None
    message: str | None = None
    traceback: str | None = None
    target_frame: TargetFrame | None = None
    environment: EnvironmentCause | None = None


class CollectedEvent(Strict):
    event: Literal["collected"] = "collected"
    count: int
    deselected: int
    nodeids: list[str] | None = None  # None: the run did not say which


class TestStartEvent(Strict):
    __test__ = False  # not a pytest test class
    event: Literal["test_start"] = "test_start"
    nodeid: str
    path: str
    line: int | None


class ReportEvent(Strict):
    """One phase of one test as pytest finally logged it, with what the gate itself saw of it."""

    event: Literal["report"] = "report"
    nodeid: str
    when: str
    outcome: str
    duration: float
    wasxfail: str | None = None
    skip: SkipSite | None = None
    failure: DescribedException | None = None
    longrepr: str = ""
    # The accountant's facts: `observed` None means the gate saw no such phase run.
    observed: PhaseObservation | None
    made_outcome: str | None = None  # pytest's own makereport, before any wrapper
    teststatus: str | None = None  # what pytest_report_teststatus calls a failed phase


class WarningEvent(Strict):
    event: Literal["warning"] = "warning"
    category: str
    message: str
    filename: str
    lineno: int
    when: str
    nodeid: str
    target_frame: TargetFrame | None
    via_torch: bool


class InterruptEvent(DescribedException):
    event: Literal["interrupt"] = "interrupt"


class InternalErrorEvent(DescribedException):
    event: Literal["internal_error"] = "internal_error"


class FinishEvent(Strict):
    event: Literal["finish"] = "finish"
    exitstatus: int
    testscollected: int
    testsfailed: int
    stopped: str | None  # why pytest stopped before running every collected test (-x, --maxfail)


# -- events of TestAccountant --------------------------------------------------------------


class SelectionEvent(Strict):
    """The selection options in effect and as each source alone would set them."""

    event: Literal["selection"] = "selection"
    addopts: list[str]
    effective: dict[str, OptionValue]
    from_addopts: dict[str, OptionValue]
    from_args: dict[str, OptionValue]
    target_hooks: list[TargetHook]


class XdistDisabledEvent(Strict):
    event: Literal["xdist_disabled"] = "xdist_disabled"
    workers: int
    dist: str


class IgnoredEvent(Strict):
    event: Literal["ignored"] = "ignored"
    path: str
    is_dir: bool
    by: str


class CollectSkipEvent(Strict):
    event: Literal["collect_skip"] = "collect_skip"
    nodeid: str
    reason: str
    path: str
    line: int | None


class Deselector(Strict):
    """Who deselected a test: an option pytest applies, or a hook of the target's."""

    by: str
    option: str | None
    site: TargetFrame | None


class DeselectedEvent(Deselector):
    event: Literal["deselected"] = "deselected"
    nodeid: str
    path: str
    line: int | None
    source_hash: str | None


class ItemsEvent(Strict):
    event: Literal["items"] = "items"
    items: list[ItemRecord]


MAX_STEP_SITES = 8


class TrainingEvent(Strict):
    """The optimizer steps one test made (setup, call and teardown), sent when it finished;
    only for a test that made some."""

    event: Literal["training"] = "training"
    nodeid: str
    optimizer_steps: int = Field(ge=1)
    # Where it stepped: `path:line` of the innermost frame of the target's code at each step,
    # the most stepped first, at most MAX_STEP_SITES; empty when no frame was the target's.
    sites: list[str] = Field(default_factory=list, max_length=MAX_STEP_SITES)


class SteppingEvent(Strict):
    """A test still making optimizer steps: sent while it runs, at most once a second, so that
    a suite stopped at its budget inside a long training test is told from one that hung."""

    event: Literal["stepping"] = "stepping"
    nodeid: str
    optimizer_steps: int = Field(ge=1)
    at: float  # the test process's wall clock (time.time()) at the step


# -- the launcher's own last event ------------------------------------------------------


class ReadsEvent(Strict):
    """What the pytest process (and the processes forked from it) opened for reading under the
    target's root, sent once pytest has returned."""

    event: Literal["reads"] = "reads"
    reads: FilesRead


PytestEvent = Annotated[
    ConftestErrorEvent | StartEvent | CollectErrorEvent | CollectedEvent | TestStartEvent | ReportEvent | WarningEvent
    | InterruptEvent | InternalErrorEvent | FinishEvent
    | SelectionEvent | XdistDisabledEvent | IgnoredEvent | CollectSkipEvent | DeselectedEvent | ItemsEvent | ReadsEvent | TrainingEvent | SteppingEvent,
    Field(discriminator="event"),
]
PYTEST_EVENTS: TypeAdapter[PytestEvent] = TypeAdapter(PytestEvent)
