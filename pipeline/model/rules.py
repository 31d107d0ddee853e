"""The rule table: one rule per finding category (and per sub-rule where one category holds
several protocol rules), the single source of what a finding is.

The gate's own rules (what any stage may report: hangs, stage errors, ...) are here; each stage
declares its own in `stages/<name>/rules.py` (`Stage.rules`), and the table is assembled from the
registered stages at start-up, so a team's stage brings categories of its own.

A finding is built from its rule (`traingate.pipeline.model.findings.finding`): the rule gives its id
(SARIF's `ruleId`), its default severity, when it blocks (`Blocks`: by the policy, never,
always), the stage that owns it, and the generic impact and fix used when a finding has
nothing more specific to say. The orchestrator's consistency check, SARIF, JUnit, `traingate
explain` and the stages' category lists read the same rules; docs/categories.md is
generated from them (`python -m traingate.pipeline.gate.categories_doc`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from traingate.pipeline.model.schema import Blocks, Category, EvidenceKind, Severity, blocks_under

ANY_STAGE = "any"
DOCS = "docs/categories.md"

_BLOCKS_TEXT = {
    Blocks.POLICY: "Blocks when its severity is in `policy.block_on` (critical and high by default).",
    Blocks.NEVER: "Never blocks.",
    Blocks.ALWAYS: "Always blocks: the gate fails closed on what it could not check.",
}


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One rule, every field named (`Rule(category=..., stage=..., ...)`)."""

    category: Category
    stage: str  # the stage that owns it, or "any"
    severity: Severity  # the default severity; a finding may be milder or graver with its evidence
    description: str  # one line, the report contract's wording (a sub-rule: the finding's title)
    check: str  # what the check does (a sub-rule: what happened)
    measure: str  # how it measures or observes
    blocks: Blocks  # when a finding of this rule blocks
    impact: str  # the generic impact, used when a finding has nothing more specific
    fix: str  # the generic fix, used when a finding has nothing more specific
    note: str = ""  # more on when it blocks (a severity the policy or the evidence changes)
    sub: str = ""  # the sub-rule's name within its category; "" for the category's own rule
    doc: str = DOCS
    # True: any stage that runs the target's code may report it, not only the stage that owns it
    # (the target's own code crashing in that stage's run is the target's defect, not the stage's).
    reported_by_any_stage: bool = False

    @property
    def id(self) -> str:
        """Stable: the category, or `category/sub-rule`."""
        return f"{self.category.value}/{self.sub}" if self.sub else self.category.value

    @property
    def blocks_text(self) -> str:
        if self.blocks is Blocks.ALWAYS and self.note:
            return f"Always blocks: {self.note}"
        return " ".join(t for t in (_BLOCKS_TEXT[self.blocks], self.note) if t)

    def blocking(self, severity: Severity, evidence: EvidenceKind, block_on: frozenset[Severity] | set[Severity]) -> bool:
        return blocks_under(self.blocks, severity, evidence, block_on)


# The gate's own rules: what any stage (or the gate itself) may report.
GATE_RULES: tuple[Rule, ...] = (
    Rule(
        category=Category.HANG, stage=ANY_STAGE, severity=Severity.CRITICAL,
        description="a run did not finish within its budget; the stacks of every thread in the evidence",
        check="Runs every child process (and every stage) under a wall-clock budget.",
        measure="Past the budget, the stacks of every thread are dumped and the process group is killed.",
        blocks=Blocks.POLICY,
        impact="A training job that hangs holds its machine until someone kills it; in CI it never reports.",
        fix="Find what the main thread waits for in the stacks below (a lock, an event, a queue, a worker) and make sure it is always released or give the wait a timeout.",
    ),
    Rule(
        category=Category.BUDGET_OVERRUN, stage=ANY_STAGE, severity=Severity.CRITICAL,
        description="a run was still making progress when its budget ran out (not a hang): how far it got and what it did not reach",
        check="Runs every child process under a wall-clock budget; for the test suite, the tests that finished and the one running when it was stopped; for a watched run of the training, the optimizer steps it made and when the last one was.",
        measure="The suite's tests finished until the end, the running one started well within the budget's last stretch; a run's last optimizer step came within 5 s (or a quarter of the run) of its end: it had not stopped.",
        blocks=Blocks.ALWAYS,
        impact="What the run did not reach was not verified, so the gate fails closed, as for a hang; nothing hung.",
        fix="Raise `timeout_s` (the stage's budget); give `tests` the paths that verify the training so the suite fits it; give a run a step budget (`max_steps`, `max_batches`).",
    ),
    Rule(
        category=Category.STAGE_ERROR, stage=ANY_STAGE, severity=Severity.CRITICAL,
        description="a stage itself failed; the gate fails closed",
        check="Validates what each stage hands back and whether it observed what it must (a test, an optimizer step).",
        measure="The stage's exit, its result file and its consistency with the policy.",
        blocks=Blocks.ALWAYS,
        impact="The gate cannot vouch for this version, so it blocks (fail closed).",
        fix="Read the traceback below; if it is a defect of traingate, report it with this report.json.",
    ),
    Rule(
        category=Category.BASELINE_UNAVAILABLE, stage=ANY_STAGE, severity=Severity.CRITICAL,
        description="the baseline revision the run was asked to judge against could not be had",
        check="Resolves `--baseline REVISION` to a commit in the checkout, then uses that commit's kept report or verifies the commit first.",
        measure="git's answer for the revision, and the base's own run.",
        blocks=Blocks.ALWAYS,
        impact="A change judged without its base escapes every check that rests on the baseline (its tests, configuration and training), so nothing is run.",
        fix="Fetch the base into the checkout (actions/checkout `fetch-depth: 0`, `git fetch origin <base>`), or give `--baseline` a report.json of the base.",
    ),
    Rule(
        category=Category.UNWATCHED_DIVERGENCE, stage=ANY_STAGE, severity=Severity.HIGH,
        description="the training leaves other results when the gate watches it than when nothing does",
        check="Compares what the execution stage's smoke call (no instrument) left once it returned with what the other stages' instrumented runs of the same configuration, seed and AMP setting left: the models still alive (a digest of their parameters) and the returned value.",
        measure="Exact equality, where the concurrency stage found the training deterministic (its same-seed runs identical); otherwise not measured (info).",
        blocks=Blocks.POLICY,
        impact="Every check of the stages describes a training that does not run when nobody watches: a change can pass the gate while the loop users run is broken.",
        fix="Remove the code that reads the gate's marks (optimizer or module hooks, modes, trace functions, patched torch functions, the environment): train the same way whether or not anything observes the loop.",
        note="Timings in returned values are left out. The gate's marks and what makes reading each pointless: docs/edited-tests.md.",
    ),
    Rule(
        category=Category.UNVERIFIED_CONFIGURATION, stage=ANY_STAGE, severity=Severity.INFO,
        description="the configuration `traingate init` wrote was not verified by its check run",
        check="Reads the `unverified` key `traingate init` writes where its check run of the proposed entry point fell short (or did not run).",
        measure="What init's check run showed, as the key says it.",
        blocks=Blocks.NEVER,
        impact="Stages that need the training ran with what init could verify: an entry point it could not run is left commented out, so they observe the tests' training, or none.",
        fix="Fill in and uncomment the proposal (docs/configuration.md, `init`), check it with `traingate init --force`, or delete the `unverified` line once the configuration trains.",
    ),
    Rule(
        category=Category.CONFIG_ERROR, stage=ANY_STAGE, severity=Severity.CRITICAL,
        description="the target's configuration is invalid",
        check="Reads `[tool.traingate]` of pyproject.toml or traingate.toml and validates every key.",
        measure="Unknown keys, wrong types and entrypoints that do not resolve, named with the file and key.",
        blocks=Blocks.ALWAYS,
        impact="traingate cannot run this target as configured, so nothing was checked.",
        fix="Correct the key named in the finding (see traingate's docs/configuration.md).",
    ),
    Rule(
        category=Category.LEFTOVER_PROCESS, stage=ANY_STAGE, severity=Severity.HIGH,
        description="a test or the entrypoint left a process running after it ended; the gate killed it",
        check="Looks for processes started by a test or the entrypoint that are still alive after it returned.",
        measure="The processes left in the child's process group or session when it ended, before the gate kills them.",
        blocks=Blocks.POLICY,
        impact="Processes left behind hold memory, devices and ports after the run, and in CI they can outlive the job or keep writing files.",
        fix="Stop what you start: join or terminate subprocesses and worker pools, shut DataLoader iterators down, and do it in a finally block or fixture teardown.",
    ),
    Rule(
        category=Category.TARGET_MODIFIED, stage=ANY_STAGE, severity=Severity.CRITICAL,
        description="the code under review changed its own tracked files while it was being checked",
        check="Runs each stage on a fresh copy of the target taken at the start, and compares the copy's source files before and after the stage; the user's own files are never run from, so they stay unchanged. "
        "It blocks on a file a later run or the gate reads, decided by observation: Python code and binaries, the configuration pytest and traingate parse, the requirements files the gate reads (root `requirements*.txt`, `requirements/*.txt`), "
        "anything under a path `tests` or the entrypoint names, and every file the stage's runs of target code opened for reading (a config it reads and rewrites); "
        "other tracked files the training only wrote are `target-modified/result-files`, reported once and never blocking. Without a complete record of the reads, every rewritten file blocks.",
        measure="Content hashes of the source files (in a git repo: tracked, or untracked and not ignored; else every file); new files are fine. "
        "The reads: an audit hook on `open` in the pytest and entrypoint children (and the processes forked from them), handed back with each run's result.",
        blocks=Blocks.ALWAYS,
        impact='What was checked is no longer the code under review, and the next run starts from different files.',
        fix='Write outputs (checkpoints, logs, caches) to a temporary folder or an ignored path, never over tracked files.',
        note='a version that rewrites itself while it is checked has not been checked.',
    ),
    Rule(
        category=Category.TARGET_MODIFIED, stage=ANY_STAGE, severity=Severity.LOW,
        description="Training writes into tracked files the gate neither runs nor reads",
        check="Of the tracked files a stage's run rewrote or deleted, those that are not Python code or binaries, not configuration that "
        "pytest or traingate parse (pyproject.toml, traingate.toml, pytest.ini, setup.cfg, tox.ini) or requirements files it reads, not under a path `tests` or the "
        "entrypoint names, and that no run of the stage opened for reading: results the training only wrote (a reproducibility snapshot, "
        "a `pip freeze` dump, a table, a log), whatever their names.",
        measure="Content hashes of the stage's copy against the pristine copy; reported once per run, by the first stage that saw each file.",
        blocks=Blocks.NEVER,
        impact='Running the training changes files under version control: every run leaves the working tree dirty, and a result committed by mistake hides the one it replaced.',
        fix='Write results to an ignored path or a folder given by a parameter (and add it to .gitignore), or leave the line be if the snapshot is meant to be committed.',
        sub='result-files',
    ),
    Rule(
        category=Category.ENVIRONMENT, stage=ANY_STAGE, severity=Severity.HIGH,
        description="the target's code imports packages this environment lacks; nothing that needs them could be verified",
        check="Classifies a run of the entrypoint (or an import of the target's code while pytest collects) that failed with an import "
        "of a module neither installed nor part of the target's tree; then reads every import of the target's Python files and "
        "lists each top-level module that is neither in the standard library, nor the target's own, nor installed, with the "
        "requirements files (requirements*.txt) and pyproject.toml dependencies that declare it. A test module's own import of "
        "a missing package stays a `test-environment`.",
        measure="The exception the harness recorded (ModuleNotFoundError), checked again by the gate with `importlib.util.find_spec` in "
        "the interpreter the target runs in; the imports read with `ast` (those under `try: ... except ImportError` and "
        "`if TYPE_CHECKING:` are optional and left out). Reported once per run.",
        blocks=Blocks.ALWAYS,
        impact="The code under review did not run: none of its tests or training checks could be verified in this environment.",
        fix="Install the missing packages in the environment the gate runs in (the finding gives the `pip install` line for all of them), "
        "and declare any the project does not declare yet in its requirements or pyproject.toml.",
        note="nothing that needs the missing packages was verified, so the gate cannot vouch for this version.",
    ),
)

# A change that rewrites how the gate verifies it, against the baseline (docs/configuration.md,
# "The baseline's verification is the floor"): reported by the gate, before and after the stages.
VERIFICATION_RULES: tuple[Rule, ...] = (
    Rule(
        category=Category.VERIFICATION_NARROWED, stage=ANY_STAGE, severity=Severity.HIGH,
        description="the change narrowed how it is verified: its gate configuration runs fewer or other tests, another entrypoint or other arguments, a check turned off or a smaller budget than the baseline's",
        check="With a `--baseline` whose report records its commit, reads the baseline's gate configuration (`[tool.traingate]` of "
        "pyproject.toml, or traingate.toml) from the git history of the target's checkout at that commit, and compares it key by "
        "key with the change's: `tests`, the entrypoint (`call`, `script`, `setup`, `args`, `kwargs`, `amp_flag`, `amp_args`, "
        "`seed`), `timeout_s`, `[distributed]` and every stage's section, and which file holds them. Each difference that narrows "
        "what is verified is a finding; one that only widens it (a test path added, a check turned on) is listed, not a finding. "
        "A waiver the change added that matched a finding is a finding too (`[[tool.traingate.waive]]` entries and inline "
        "`traingate: ignore[...]` comments the baseline's tree did not have apply only when the CI policy sets `allow_new_waivers = true`).",
        measure="Both configurations are read as files in the gate's own process (TOML, never imported); the baseline's with `git cat-file` "
        "at a commit id the report recorded. The evidence holds both values side by side and the diff of the two configurations.",
        blocks=Blocks.POLICY,
        impact="The version under review chose what the gate runs and what it accepts: a suite switched off, the entrypoint pointed at "
        "another function, a keyword that selects a path users never take, or a waiver for its own findings makes the verdict its own.",
        fix="Restore the baseline's configuration for the key named (or remove the new waiver). A configuration change the team intends "
        "is accepted by the CI: `allow_config_changes = true` (or `allow_new_waivers = true`) in the CI policy file, for a trusted pull request.",
        note="A difference the CI policy accepts (`allow_config_changes`) is `verification-narrowed/accepted`, info, never blocking. See docs/configuration.md.",
    ),
    Rule(
        category=Category.VERIFICATION_NARROWED, stage=ANY_STAGE, severity=Severity.MEDIUM,
        description="the baseline's entrypoint no longer exists or no longer takes its arguments on this version; the change's own entrypoint ran",
        check="The change's entrypoint configuration differs from the baseline's, and the baseline's entrypoint, smoke-called on this "
        "version, stopped at an ImportError, AttributeError, NameError or TypeError before any of the target's code ran (its "
        "module, function, method or setup renamed, a keyword no longer a parameter), or its script is not in this version.",
        measure="The exception the harness recorded for the baseline entrypoint's smoke call, and whether a frame of the target's code "
        "raised it. Where the files already say the baseline's entrypoint is gone (read with `ast`), the entrypoint's "
        "configuration differences are listed as an interface change instead of blocking.",
        blocks=Blocks.POLICY,
        impact="The entrypoint was renamed with its configuration; whether the renamed code behaves as the baseline's did is verified only by the change's own configuration.",
        fix="Read the configuration diff: if only the names changed, nothing to do; `interface_changes_block = true` in the policy makes these block.",
        note="Medium by default; `interface_changes_block = true` in the policy makes it high.",
        sub="interface-changed",
    ),
    Rule(
        category=Category.VERIFICATION_NARROWED, stage=ANY_STAGE, severity=Severity.MEDIUM,
        description="the baseline's gate configuration could not be read; the change's configuration and waivers were not compared",
        check="A `--baseline` was given, but its report records no commit, the commit is not in this clone, or its configuration file does "
        "not validate with this version of traingate.",
        measure="`git cat-file` in the target's checkout at the commit the baseline report recorded.",
        blocks=Blocks.POLICY,
        impact="Whether the change narrowed how it is verified, or waived its own findings, was not checked.",
        fix="Fetch the history the baseline needs (actions/checkout `fetch-depth: 0`), and keep the baseline report of a committed version.",
        sub="not-compared",
    ),
    Rule(
        category=Category.VERIFICATION_NARROWED, stage=ANY_STAGE, severity=Severity.INFO,
        description="a configuration change the CI policy accepts",
        check="A difference that narrows what is verified, in a run whose CI policy sets `allow_config_changes = true`.",
        measure="As for `verification-narrowed`.",
        blocks=Blocks.NEVER,
        impact="None: a trusted pipeline accepted the change's configuration.",
        fix="Nothing to do.",
        sub="accepted",
    ),
)


class RuleTable:
    """The rules of the gate and of the stages a process knows, looked up by id and category."""

    def __init__(self, rules: Iterable[Rule]) -> None:
        self.rules = tuple(rules)
        self._by_id: dict[str, Rule] = {}
        for rule in self.rules:
            if rule.id in self._by_id:
                raise ValueError(f"two rules have the id {rule.id!r} ({self._by_id[rule.id].stage} and {rule.stage})")
            self._by_id[rule.id] = rule
        self._by_category = {rule.category: rule for rule in self.rules if not rule.sub}
        orphans = sorted({rule.id for rule in self.rules if rule.category not in self._by_category})
        if orphans:
            raise ValueError(f"sub-rules without their category's own rule: {', '.join(orphans)}")

    def __iter__(self) -> Iterator[Rule]:
        return iter(self.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def for_category(self, category: Category) -> Rule:
        """The category's own rule."""
        found = self._by_category.get(category)
        if found is None:
            raise KeyError(f"no rule of category {category.value!r}: is the stage that owns it installed?")
        return found

    def by_id(self, rule_id: str) -> Rule | None:
        """A rule by its id (`memory-leak`, `gradscaler-protocol/missing-update`), or None."""
        return self._by_id.get(rule_id)

    def rule(self, category: Category, rule_id: str | None) -> Rule:
        """The rule a finding of `category` is built from: `rule_id` (a sub-rule) or the category's own."""
        if rule_id is None:
            return self.for_category(category)
        found = self.by_id(rule_id)
        if found is None or found.category is not category:
            raise ValueError(f"no rule {rule_id!r} of category {category.value}")
        return found

    def sub_rules(self, category: Category) -> tuple[Rule, ...]:
        return tuple(rule for rule in self.rules if rule.category is category and rule.sub)

    def categories(self) -> list[Category]:
        """Every category, once each, in the table's order."""
        return list(self._by_category)

    def categories_of(self, stage: str) -> frozenset[Category]:
        """The categories a stage owns (ANY_STAGE: the gate's)."""
        return frozenset(rule.category for rule in self.rules if rule.stage == stage)

    def reported_by_any_stage(self) -> frozenset[Category]:
        """The categories a stage other than their owner may report (`Rule.reported_by_any_stage`)."""
        return frozenset(rule.category for rule in self.rules if rule.reported_by_any_stage)

    def explain(self, rule: Rule) -> str:
        """The text `traingate explain RULE` prints."""
        subs = self.sub_rules(rule.category) if not rule.sub else ()
        return "\n".join(
            [
                f"{rule.id} ({rule.stage} stage, usually {rule.severity.value})",
                "",
                f"{rule.description[0].upper()}{rule.description[1:]}" + ("" if rule.description.endswith(".") else "."),
                "",
                f"What it checks: {rule.check}",
                f"How it measures: {rule.measure}",
                f"What blocks: {rule.blocks_text}",
                f"Impact: {rule.impact}",
                f"How to fix: {rule.fix}",
                *([f"Sub-rules: {', '.join(r.id for r in subs)}"] if subs else []),
                f"More: {rule.doc}",
            ]
        )


GATE_TABLE = RuleTable((*GATE_RULES, *VERIFICATION_RULES))
ANY_STAGE_CATEGORIES = GATE_TABLE.categories_of(ANY_STAGE)
