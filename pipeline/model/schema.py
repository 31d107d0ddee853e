"""The typed report: the field names and categories of docs/contract.md, sections 3 and 4.

Findings are frozen and complete at birth; `Finding.create` computes the fingerprint and the
blocking flag so that no stage can hand back a finding that breaks the evidence rules.
"""

from __future__ import annotations

import hashlib
import re
from enum import Enum
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler, model_validator
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import core_schema
from traingate.stages.common.reads import FilesRead
from traingate.pipeline.model.text import strip_ansi

SCHEMA_VERSION = "1.2"


class Category(str):
    """A finding's category: one of the gate's own (below: what any stage may report) or one a
    registered stage declares beside its rules (`stages/<name>/rules.py`: `MEMORY_LEAK =
    Category("memory-leak")`).

    Instances are interned, so `finding.category is Category.HANG` (or `is MEMORY_LEAK`) holds
    for a category read back from JSON as for one built in code; `value` is the name, as an
    enum member's would be. Which categories exist is the rule table's to say: the gate checks
    every finding against it.
    """

    _interned: ClassVar[dict[str, Category]] = {}
    _builtin: ClassVar[list[Category]] = []

    # A change that narrowed how it is verified, against its baseline (docs/configuration.md).
    VERIFICATION_NARROWED: ClassVar[Category]
    HANG: ClassVar[Category]
    STAGE_ERROR: ClassVar[Category]
    CONFIG_ERROR: ClassVar[Category]
    LEFTOVER_PROCESS: ClassVar[Category]
    TARGET_MODIFIED: ClassVar[Category]
    ENVIRONMENT: ClassVar[Category]
    BASELINE_UNAVAILABLE: ClassVar[Category]
    UNWATCHED_DIVERGENCE: ClassVar[Category]
    BUDGET_OVERRUN: ClassVar[Category]
    UNVERIFIED_CONFIGURATION: ClassVar[Category]

    def __new__(cls, value: str) -> Category:
        if isinstance(value, Category):
            return value
        known = cls._interned.get(value)
        if known is not None:
            return known
        if not isinstance(value, str) or not _CATEGORY_NAME.fullmatch(value):
            raise ValueError(f"{value!r} is not a category name (lowercase words joined by '-')")
        made = cls._interned[value] = super().__new__(cls, value)
        return made

    @property
    def value(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"Category({self.value!r})"

    def __reduce__(self) -> tuple[type[Category], tuple[str]]:
        return (Category, (self.value,))

    @classmethod
    def builtin(cls) -> list[Category]:
        """The gate's own categories, in their order (the registered stages declare the others)."""
        return list(cls._builtin)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(
            cls,
            core_schema.str_schema(pattern=_CATEGORY_NAME.pattern),
            serialization=core_schema.plain_serializer_function_ser_schema(str.__str__, when_used="always"),
            metadata={"pydantic_js_updates": {"description": "one of the gate's own categories (`examples`) or one a registered stage declares", "examples": [c.value for c in cls._builtin]}},
        )


_CATEGORY_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
Category.VERIFICATION_NARROWED = Category("verification-narrowed")
Category.HANG = Category("hang")
Category.STAGE_ERROR = Category("stage-error")
Category.CONFIG_ERROR = Category("config-error")
Category.LEFTOVER_PROCESS = Category("leftover-process")
Category.TARGET_MODIFIED = Category("target-modified")
Category.ENVIRONMENT = Category("environment")
Category.BASELINE_UNAVAILABLE = Category("baseline-unavailable")
Category.UNWATCHED_DIVERGENCE = Category("unwatched-divergence")
Category.BUDGET_OVERRUN = Category("budget-overrun")
Category.UNVERIFIED_CONFIGURATION = Category("unverified-configuration")
Category._builtin.extend(Category._interned.values())


class Severity(str, Enum):
    CRITICAL = "critical"
    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"
    INFO = "info"

    @property
    def rank(self) -> int:
        """0 for critical, 4 for info: sorts the worst first."""
        return list(Severity).index(self)


class EvidenceKind(str, Enum):
    MEASURED = "measured"
    OBSERVED = "observed"
    STATIC = "static"


class Blocks(str, Enum):
    """When a rule's findings block (`traingate.pipeline.model.rules`)."""

    POLICY = "policy"  # when the finding's severity is in `policy.block_on`
    NEVER = "never"  # shown, never blocking (a deprecation)
    ALWAYS = "always"  # the gate fails closed whatever the policy says


def blocks_under(blocks: Blocks, severity: Severity, evidence: EvidenceKind, block_on: frozenset[Severity] | set[Severity] | list[Severity]) -> bool:
    """The one blocking formula: a rule's mode, the finding's severity and evidence, the policy.
    Static evidence never blocks (docs/contract.md, rule 5.1)."""
    if evidence is EvidenceKind.STATIC or blocks is Blocks.NEVER:
        return False
    return blocks is Blocks.ALWAYS or severity in set(block_on)


class StageStatus(str, Enum):
    PASSED = "passed"
    BLOCKED = "blocked"
    SKIPPED = "skipped"
    ERROR = "error"


class Decision(str, Enum):
    PASS = "PASS"
    BLOCK = "BLOCK"


_FROZEN = ConfigDict(frozen=True, extra="forbid")


class Location(BaseModel):
    model_config = _FROZEN
    path: str = Field(description="Path relative to the target root")
    line: int | None = Field(default=None, description="1-based line number")
    function: str | None = Field(default=None, description="Enclosing function, if known")


class Evidence(BaseModel):
    """What supports a finding. `data` holds the numbers, call sites or sequences."""

    model_config = _FROZEN
    kind: EvidenceKind
    summary: str = Field(default="", description="One line a reader can check")
    traceback: str | None = Field(default=None, description="Traceback or thread stacks")
    data: dict[str, Any] = Field(default_factory=dict, description="Numbers, call sites, sequences")


class WaiverMark(BaseModel):
    """Why a finding that would block was accepted: the waiver that matched it."""

    model_config = _FROZEN
    reason: str
    source: str = Field(description="config (a [[waive]] entry) | inline (a `# traingate: ignore[...]` comment)")
    origin: str = Field(description="where the waiver is written: the configuration entry or the source line")
    expires: str | None = Field(default=None, description="ISO date after which the waiver no longer applies")


# `evidence.data[LOCATIONS_KEY]`: every place of a finding that names one cause found at several
# (the test files a suite leaves out, the lines of one deprecated call), as Location records;
# the finding's `location`, when it has one, is the first. SARIF carries them all.
LOCATIONS_KEY = "locations"


class Finding(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    id: str = Field(description="Fingerprint, stable across versions for the same defect")
    stage: str
    category: Category
    rule: str = Field(default="", description="the id of the rule it was built from: its category, or category/sub-rule (`gradscaler-protocol/clip-before-unscale`)")
    severity: Severity
    title: str
    location: Location | None
    problem: str
    impact: str
    fix: str
    evidence: Evidence
    blocking: bool
    waived: WaiverMark | None = Field(default=None, description="the waiver that accepted this finding; a waived finding never blocks")
    baseline_status: str | None = Field(
        default=None, description="new | persisting: whether the baseline had this id (null without a baseline)"
    )

    @model_validator(mode="after")
    def _evidence_rules(self) -> Finding:
        # docs/contract.md, rule 5.1: static evidence is at most medium and never blocks.
        if self.evidence.kind is EvidenceKind.STATIC:
            if self.severity.rank < Severity.MEDIUM.rank:
                raise ValueError("a finding with static evidence is at most medium")
            if self.blocking:
                raise ValueError("a finding with static evidence never blocks")
        if self.waived is not None and self.blocking:
            raise ValueError("a waived finding never blocks")
        return self

    def every_location(self) -> list[Location]:
        """The finding's location, then each other place its evidence lists, once each; a
        record that is not a place is left out."""
        places = [self.location] if self.location is not None else []
        listed = self.evidence.data.get(LOCATIONS_KEY)
        for record in listed if isinstance(listed, list) else []:
            try:
                place = Location.model_validate(record)
            except ValueError:
                continue
            if place not in places:
                places.append(place)
        return places

    @classmethod
    def create(
        cls,
        *,
        stage: str,
        category: Category,
        severity: Severity,
        title: str,
        location: Location | None,
        problem: str,
        impact: str,
        fix: str,
        evidence: Evidence,
        block_on: frozenset[Severity] | set[Severity] | list[Severity],
        key: str = "",
        rule: str = "",
        blocks: Blocks = Blocks.POLICY,
    ) -> Finding:
        """Build a complete finding.

        `key` distinguishes defects of one category at one place (a test id, the text of the
        offending line); it must not contain line numbers, so the id survives unrelated edits.
        `rule` and `blocks` come from the rule table: build findings through
        `traingate.pipeline.model.findings.finding`, which looks them up.
        """
        if evidence.kind is EvidenceKind.STATIC and severity.rank < Severity.MEDIUM.rank:
            severity = Severity.MEDIUM
        # Messages and tracebacks come from the target's output: no terminal escape codes in a report.
        title, problem, impact, fix = (strip_ansi(t) for t in (title, problem, impact, fix))
        evidence = evidence.model_copy(
            update={"summary": strip_ansi(evidence.summary), "traceback": strip_ansi(evidence.traceback) if evidence.traceback else evidence.traceback}
        )
        return cls(
            id=fingerprint(stage, category, location, key),
            stage=stage,
            category=category,
            rule=rule or category.value,
            severity=severity,
            title=title,
            location=location,
            problem=problem,
            impact=impact,
            fix=fix,
            evidence=evidence,
            blocking=blocks_under(blocks, severity, evidence.kind, block_on),
        )

    def sort_key(self) -> tuple[int, str, str, int]:
        loc = self.location
        return (self.severity.rank, self.category.value, loc.path if loc else "", (loc.line or 0) if loc else 0)


def fingerprint(stage: str, category: Category, location: Location | None, key: str) -> str:
    """Hash of what identifies a defect, without line numbers (they move with unrelated edits)."""
    parts = [stage, category.value]
    if location is not None:
        parts += [location.path, location.function or ""]
    parts.append(" ".join(key.split()))
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


class Metric(BaseModel):
    model_config = _FROZEN
    # Empty only in reports written before metric ids existed (schema 1.0): such a report
    # still loads as a --baseline, and its metrics are simply not compared.
    id: str = Field(default="", description="Stable identifier (`amp.speedup`, `step_time.median.fp32`); baselines are compared on it")
    name: str = Field(description="The label reports show; free to change wording")
    value: float | int | str | None
    unit: str = ""
    threshold: float | int | None = None
    passed: bool | None = Field(default=None, description="null when no threshold applies here")
    note: str = ""


class TakenOut(BaseModel):
    """How a test was kept from running or from counting: a skip or xfail (declared in the
    source, added by a hook, or called at run time), a deselection, an ignored path, a module
    skipped at collection."""

    model_config = _FROZEN
    how: str = Field(description="skip-marker | skip-marker-added | skip-call | xfail-marker | xfail-marker-added | xfail-call | deselected | ignored | module-skipped | not-run")
    by: str = Field(description="what did it, in words: `@pytest.mark.skipif`, `-k 'not slow'` (addopts in pyproject.toml), a hook")
    reason: str = ""
    where: Location | None = Field(default=None, description="the marker, call, hook or configuration line, when known")
    strict: bool | None = Field(default=None, description="xfail only: whether an unexpected pass fails")


class TestRecord(BaseModel):
    """One test of the execution stage's pytest run, as the gate observed it; a later version's
    run is compared with these by node id (or, for a moved or renamed test, by `source_hash`)."""

    __test__ = False  # not a pytest test class
    model_config = _FROZEN
    nodeid: str = Field(description="pytest's node id; for a path kept out of collection, the path")
    outcome: str = Field(description="passed | failed | error | skipped | xfailed | xpassed | crashed | interrupted | deselected | not-collected | not-run (collected, never reached: `-x`, `--collect-only`, a run that ended early)")
    path: str | None = None
    line: int | None = None
    source_hash: str | None = Field(default=None, description="hash of the test function's body, without its name and decorators")
    duration_s: float = 0.0
    message: str = ""
    taken_out: TakenOut | None = None
    rewritten: str | None = Field(default=None, description="when a hook made the logged outcome differ from what the test did: which, and how")
    optimizer_steps: int = Field(default=0, ge=0, description="optimizer steps the test made in the gate's run (setup and teardown included); 0: none seen")
    step_sites: list[str] = Field(default_factory=list, description="where it made them: `path:line` of the innermost frame of the target's code at each step and a digest of the stepped parameters' shapes, `path:line (parameters DIGEST)`, the most stepped first")


class RunLeft(BaseModel):
    """How one entrypoint run of a stage ended, for the gate's unwatched comparison
    (`pipeline/gate/unwatched.py`): what it returned and the models it left (`stages/harness/left.py`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    stage: str
    label: str
    amp: bool | None
    watched: bool  # the run carried instruments (or a step budget) the target's code could see
    returned: Any = None
    models: list[dict[str, Any]] = Field(default_factory=list)  # {model, parameters, digest}


class TrainingStopped(BaseModel):
    """A fact a stage hands to the gate for the stages after it: one of its findings shows that
    the training function cannot run here (it crashed, packages it imports are missing, or its
    smoke call hung), so a later stage that runs it is skipped while that finding blocks."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    finding: str  # the id of the finding that shows it
    reason: Literal["crash", "environment", "hang"]
    missing: list[str] = Field(default_factory=list)  # environment: the modules not installed


class TrainingTest(BaseModel):
    """A test that made optimizer steps in the execution stage's run."""

    __test__ = False  # not a pytest test class
    model_config = _FROZEN
    nodeid: str
    optimizer_steps: int
    duration_s: float = 0.0
    step_sites: list[str] = Field(default_factory=list, description="where it stepped (`TestRecord.step_sites`)")


class ObservedTest(BaseModel):
    """One test whose training the stages that observe training ran, and why it was picked."""

    __test__ = False  # not a pytest test class
    model_config = _FROZEN
    nodeid: str
    optimizer_steps: int | None = Field(default=None, description="its optimizer steps in the execution stage's run; null: it made none there")
    step_sites: list[str] = Field(default_factory=list, description="where it stepped")
    reason: str = Field(description="why it was picked")
    baseline_form: bool = Field(default=False, description="run as the baseline's commit has its test code")


class NotObserved(BaseModel):
    """A test that trained but was not observed, and why (the same step site as a test picked
    before it, fewer steps than a verdict needs, or the limit on observed tests)."""

    model_config = _FROZEN
    nodeid: str
    optimizer_steps: int
    reason: str


class ObservedRun(BaseModel):
    """One observed test's run in a stage that observes training: whether the stage reached it
    within its budget, and the seconds it ran."""

    model_config = _FROZEN
    nodeid: str
    reached: bool
    duration_s: float = 0.0
    budget_s: float = Field(description="the share of the stage's budget it was given")
    note: str = ""


class ObservedTraining(BaseModel):
    """With no entrypoint configured: the test whose training the stages that observe training
    ran as their entrypoint, and why that one (or why none)."""

    model_config = _FROZEN
    test: str | None = Field(description="the pytest node id observed; null when no test trained enough to be observed")
    optimizer_steps: int | None = Field(default=None, description="the optimizer steps it made in the execution stage's run")
    reason: str = Field(description="why this test was chosen, or why none was")
    baseline_form: bool = Field(default=False, description="run as the baseline's commit has its test code: the change edited it")
    min_steps: int = Field(description="fewer optimizer steps than this: not measured")
    candidates: list[TrainingTest] = Field(default_factory=list, description="the tests that made optimizer steps, most steps first")
    tests: list[ObservedTest] = Field(default_factory=list, description="every test observed, in the order the stages run them; `test` is the first")
    not_observed: list[NotObserved] = Field(default_factory=list, description="the tests that trained but were not observed, and why")
    limit: int = Field(default=1, ge=1, description="the most tests observed (`observe_tests`)")

    def past_limit(self) -> list[NotObserved]:
        """The tests not observed only because `observe_tests` was reached."""
        return [n for n in self.not_observed if n.reason.startswith("limit")]

    def past_limit_note(self) -> str | None:
        """One line naming them and the key that widens the observation; None when none."""
        left = self.past_limit()
        if not left:
            return None
        return f"training NOT observed: {len(left)} test(s) past the limit, e.g. {left[0].nodeid}; raise `observe_tests` (now {self.limit}) to observe them"


class StageOutcome(BaseModel):
    """What a stage agent hands back to the parent; the parent derives status and score."""

    model_config = ConfigDict(extra="forbid")
    summary: str
    skipped_reason: str | None = None
    metrics: list[Metric] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    details: dict[str, Any] = Field(
        default_factory=dict, description="Stage-specific observations its report renders"
    )
    tests: list[TestRecord] = Field(default_factory=list, description="execution stage: every test of the suite run, one record each")
    # What the stage's runs of target code opened for reading under its root; None: unknown
    # (the agent handed back none). The gate reads it, the report does not carry it.
    files_read: FilesRead | None = None
    training_stopped: list[TrainingStopped] = Field(default_factory=list)
    # Every entrypoint run of the configured training, as it ended (the unwatched comparison).
    runs_left: list[RunLeft] = Field(default_factory=list)
    # A stage that compared same-seed runs of the training: its verdict ("identical: ..." where
    # they matched exactly), which says whether the unwatched comparison can be judged.
    determinism: str | None = None
    # execution stage, no entrypoint configured: the test the later stages observe, and the
    # baseline's test files (path -> text, None: absent) it runs with in its baseline form.
    observed_training: ObservedTraining | None = None
    observed_files: dict[str, str | None] = Field(default_factory=dict)


class StageReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    status: StageStatus
    score: int | None = Field(description="0-100; null for a skipped stage")
    duration_s: float
    summary: str
    skipped_reason: str | None = None
    metrics: list[Metric] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)
    tests: list[TestRecord] = Field(default_factory=list, description="execution stage: every test of the suite run, one record each; a --baseline is compared with them")
    environment: Environment | None = Field(
        default=None, description="where this stage ran, when it differs per stage (a merged split run)"
    )
    # For the stages after it (`StageOutcome.training_stopped`); report.json does not carry it.
    training_stopped: SkipJsonSchema[list[TrainingStopped]] = Field(default_factory=list, exclude=True)
    # For the stages after it (`StageOutcome.observed_training`); the report carries the first at its top.
    observed_training: SkipJsonSchema[ObservedTraining | None] = Field(default=None, exclude=True)
    observed_files: SkipJsonSchema[dict[str, str | None]] = Field(default_factory=dict, exclude=True)
    # For the gate's unwatched comparison (`StageOutcome.runs_left`); report.json does not carry it.
    runs_left: SkipJsonSchema[list[RunLeft]] = Field(default_factory=list, exclude=True)
    determinism: SkipJsonSchema[str | None] = Field(default=None, exclude=True)
    observed_runs: list[ObservedRun] = Field(
        default_factory=list, description="a stage that observed the tests' training: each observed test it ran or did not reach, in order"
    )


class TargetInfo(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    commit: str | None = None


class Environment(BaseModel):
    model_config = ConfigDict(extra="forbid")
    python: str
    torch: str | None
    device: str
    device_name: str
    platform: str = ""


class BaselineSource(BaseModel):
    """`--baseline REVISION`: the commit it named and how its report was had."""

    model_config = ConfigDict(extra="forbid")
    revision: str
    commit: str | None = None
    how: Literal["kept", "verified"] | None = Field(default=None, description="kept: an earlier run's report of that commit; verified: made in this run")
    note: str = ""


class BaselineComparison(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str
    version: str | None = None
    source: BaselineSource | None = Field(default=None, description="the revision it was given as, when --baseline named one")
    new_findings: list[str] = Field(default_factory=list, description="ids not in the baseline")
    fixed_findings: list[str] = Field(default_factory=list, description="baseline ids now gone")
    persisting_findings: list[str] = Field(default_factory=list, description="ids in both the baseline and this report")
    metric_deltas: list[dict[str, Any]] = Field(default_factory=list)


class PolicySetting(BaseModel):
    """One value of the policy the decision used, and where it came from."""

    model_config = ConfigDict(extra="forbid")
    key: str
    value: Any
    source: str = Field(description="default | ci-policy | target")


class IgnoredPolicySetting(BaseModel):
    """A value the target's own configuration asked for and did not get: it loosened the policy."""

    model_config = ConfigDict(extra="forbid")
    key: str
    value: Any
    file: str = Field(description="the target's configuration file")
    reason: str


class PolicyProvenance(BaseModel):
    model_config = ConfigDict(extra="forbid")
    ci_file: str | None = Field(default=None, description="the --policy / TRAINGATE_POLICY file, if one was given")
    settings: list[PolicySetting] = Field(default_factory=list)
    ignored: list[IgnoredPolicySetting] = Field(default_factory=list)


class StageNotRun(BaseModel):
    """A known stage whose checks did not run in this report, and why."""

    model_config = ConfigDict(extra="forbid")
    name: str
    reason: str = Field(description="\"not requested with --stages\", or \"skipped: \" and the stage's reason")


class WaiverEntry(BaseModel):
    """One waiver the target wrote, and what became of it in this run."""

    model_config = ConfigDict(extra="forbid")
    origin: str = Field(description="the configuration entry (`pyproject.toml [[tool.traingate.waive]] #1`) or the source line")
    source: str = Field(description="config | inline")
    id: str | None = None
    categories: list[str] = Field(default_factory=list)
    path: str | None = None
    line: int | None = None
    function: str | None = None
    reason: str
    expires: str | None = None
    status: str = Field(description="applied | unused | expired | refused | disallowed | needs-approval")
    matched: list[str] = Field(default_factory=list, description="ids of the findings it matched")
    note: str = ""
    added: bool | None = Field(default=None, description="true: the change under review added it (not in the baseline's tree); None: not compared (no baseline)")


class Acceptance(BaseModel):
    """What the gate accepted without blocking: waived findings and, with policy.block = "new",
    findings the baseline already had."""

    model_config = ConfigDict(extra="forbid")
    block: str = Field(default="all", description="all | new: the rule applied (new only with a baseline)")
    block_note: str = ""
    waivers_allowed: bool = True
    waivers: list[WaiverEntry] = Field(default_factory=list)


class ConfigChange(BaseModel):
    """One difference between the baseline's gate configuration and the change's, and what the gate did about it."""

    model_config = ConfigDict(extra="forbid")
    key: str = Field(description="the configuration key (`tests`, `entrypoint.kwargs.lr`, `performance.min_steps`, `(file)`)")
    baseline: Any = Field(default=None, description="the baseline's value (null: not set)")
    current: Any = Field(default=None, description="the change's value (null: not set)")
    effect: str = Field(description="narrows | widens | neutral: what it does to what is verified")
    action: str = Field(description="what the gate did: blocks, accepted by the CI policy, listed, interface changed")


class VerificationReview(BaseModel):
    """What the change under review changed in how it is verified: its gate configuration and
    its waivers, compared with the baseline's (read from git at the commit the baseline recorded)."""

    model_config = ConfigDict(extra="forbid")
    compared: bool = Field(description="false: no baseline, or its configuration could not be read")
    note: str = ""
    baseline_commit: str | None = None
    baseline_file: str | None = Field(default=None, description="the baseline's configuration file (null: it had none)")
    current_file: str | None = Field(default=None, description="the change's configuration file (null: it has none)")
    changes: list[ConfigChange] = Field(default_factory=list)
    new_waivers: list[WaiverEntry] = Field(default_factory=list, description="waivers the change added, and what became of them")
    baseline_entrypoint: str | None = Field(default=None, description="the baseline's entrypoint, smoke-called on this version because the change's differs")


class PipelineReport(BaseModel):
    model_config = ConfigDict(extra="forbid")
    schema_version: str = SCHEMA_VERSION
    tool_version: str
    task: str
    version: str
    target: TargetInfo
    environment: Environment
    started_at: str
    duration_s: float
    decision: Decision
    score: int = Field(ge=0, le=100)
    stages: list[StageReport]
    baseline: BaselineComparison | None = None
    policy: PolicyProvenance | None = Field(default=None, description="the policy the decision used, value by value with its source")
    stages_not_run: list[StageNotRun] = Field(default_factory=list, description="stages whose checks did not run, and why: a PASS vouches only for the stages that ran")
    acceptance: Acceptance | None = Field(default=None, description="waivers and the new-findings rule, and what they accepted")
    verification: VerificationReview | None = Field(default=None, description="the change's gate configuration and waivers against the baseline's")
    observed_training: ObservedTraining | None = Field(
        default=None, description="no entrypoint configured: the test whose training the stages observed, and why (null with an entrypoint)"
    )

    def findings(self) -> list[Finding]:
        return sorted((f for s in self.stages for f in s.findings), key=Finding.sort_key)


# StageReport names Environment, defined after it.
StageReport.model_rebuild()
