"""The execution stage's `details`: what its report page (`report.md.j2` beside this module) shows.

The stage builds them (`traingate.stages.execution.stage`); see `traingate.pipeline.model.details`.
"""

from __future__ import annotations

from typing import Any


from traingate.pipeline.model.details import Detail
from traingate.pipeline.model.schema import TestRecord


# -- the test suite ------------------------------------------------------------------------


class SuiteCounts(Detail):
    """The run's tests by what became of them."""

    collected: int
    deselected: int
    not_collected: int
    rewritten: int
    not_run: int
    passed: int
    failed: int
    errors: int
    skipped: int
    xfailed: int
    xpassed: int
    collection_errors: int
    environment: int
    environment_modules: int


class SkipGroup(Detail):
    """Skipped tests that share a reason, located at the first one's skip."""

    reason: str
    count: int
    tests: list[str]
    path: str | None
    line: int | None


class TestRow(Detail):
    __test__ = False  # not a pytest test class
    nodeid: str
    outcome: str
    duration_s: float
    message: str


class CollectionErrorRow(Detail):
    nodeid: str
    type: str | None
    message: str


class XdistDisabled(Detail):
    """The target's options spread the tests over xdist workers; the gate ran them in one process."""

    event: str  # the plugin's event kind, kept as it was logged
    workers: int
    dist: str


class BaselineNotCompared(Detail):
    note: str  # why not


class BaselineTests(Detail):
    """The per-test comparison with the baseline."""

    version: str
    compared: int
    moved: list[dict[str, str]]  # {"from": old node id, "to": new node id}, followed by the source's hash
    newly_passing: list[dict[str, str]]  # {"nodeid", "was": the baseline's outcome}
    disabled: list[str]  # node ids


class ReplayRow(Detail):
    """What the baseline's form of one test did on this version."""

    nodeid: str
    verdict: str  # passed | weakened | interface | environment
    outcome: str
    error: str


class ReplayDetails(Detail):
    """The baseline's tests replayed on this version (docs/edited-tests.md)."""

    commit: str | None
    note: str  # why nothing was replayed; "" when the replay ran
    files: list[str]  # the baseline's test files that ran
    tests: list[ReplayRow]
    command: str = ""
    duration_s: float | None = None


class Accounting(Detail):
    taken_out: list[TestRecord]
    rewritten: list[TestRecord]
    options: dict[str, str]  # option destination -> as a reader writes it
    xdist_disabled: XdistDisabled | None
    baseline: BaselineTests | BaselineNotCompared
    replay: ReplayDetails | None = None


class PytestDetails(Detail):
    command: str
    config_file: str | None
    source: str = ""  # where the tests came from: the paths given, or pytest's own rules
    exit_status: int | None
    exit_meaning: str
    duration_s: float
    timed_out: bool
    finished: bool
    counts: SuiteCounts
    tests: list[TestRow]
    tests_omitted: int
    skips: list[SkipGroup]
    collection_errors: list[CollectionErrorRow]
    stdout_tail: str
    accounting: Accounting


class NoSuite(Detail):
    """`tests = false`: pytest was not run."""

    declared: bool  # always false
    note: str


# -- the smoke call ------------------------------------------------------------------------


class SmokeRun(Detail):
    label: str
    amp: bool | None
    ok: bool
    failure: str | None
    duration_s: float | None
    wall_s: float
    returned: str | None
    stdout_head: str
    exit_status: int | None
    budget_stop: str | None = None  # what the step budget did: a controlled stop, not a failure


class SmokeNotConfigured(Detail):
    configured: bool  # always false
    runs: list[SmokeRun]
    notes: list[str]


class SmokeDetails(Detail):
    configured: bool  # always true
    label: str
    call: str | None
    script: str | None
    args: list[str]
    amp_args: dict[str, list[str]] | None
    setup: str | None
    kwargs: dict[str, Any]  # the configured keyword arguments, as written
    amp_flag: str | None
    seed: int
    device: str
    runs: list[SmokeRun]
    notes: list[str]


# -- coverage and warnings -----------------------------------------------------------------


class NoEntrypoint(Detail):
    measured: bool  # always false
    note: str


class EntrypointCoverage(Detail):
    """How much of the entrypoint's body the suite executed; `executed_statements` None when not measured."""

    measured: bool
    path: str
    function: str
    def_line: int | None
    body_statements: int
    executed_statements: int | None
    executed_lines: list[int]
    note: str


class WarningRow(Detail):
    category: str
    message: str
    location: str
    code: str
    sources: list[str]
    count: int
    deprecated_torch_api: bool


class ExecutionDetails(Detail):
    pytest: PytestDetails | NoSuite | None = None
    smoke: SmokeDetails | SmokeNotConfigured | None = None
    coverage: EntrypointCoverage | NoEntrypoint | None = None
    warnings: list[WarningRow] = []
