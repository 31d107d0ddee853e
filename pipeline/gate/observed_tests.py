"""With no entrypoint configured, the training inside the tests is observed: the execution
stage names the tests (`StageOutcome.observed_training`), and the stages after it that run
the training function get each as their entrypoint in turn, a test run by pytest under their
probes (`observed_runs`); a finding that several of them showed is reported once.

With an entrypoint configured, nothing here applies: the configuration is handed on as it is.
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import BaseModel, ConfigDict

from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.model.schema import Finding, ObservedTraining, StageReport

# `evidence.data[TRAINING_TEST_KEY]`: the test whose training a finding was observed in (the
# first, where several showed it: all of them under TRAINING_TESTS_KEY).
TRAINING_TEST_KEY = "training_test"
TRAINING_TESTS_KEY = "training_tests"


class _ObservedIn(BaseModel):
    """What `with_test_named` wrote into a finding's evidence, read back: the test it names
    (the field is named as TRAINING_TEST_KEY)."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    training_test: str | None = None


def fact(reports: list[StageReport]) -> ObservedTraining | None:
    """The observed training the stages so far named (the first one that did)."""
    return next((r.observed_training for r in reports if r.observed_training is not None), None)


def stage_config(config: TargetConfig, needs_training: bool, reports: list[StageReport]) -> TargetConfig:
    """The configuration a stage runs with: the target's, or, for a stage that runs the
    training function (`needs_training`) where none is configured, the target's with the
    observed test as its entrypoint."""
    observed = fact(reports)
    if not needs_training or config.entrypoint is not None or observed is None or observed.test is None:
        return config
    files = next((r.observed_files for r in reports if r.observed_training is not None), {})
    entrypoint = EntrypointConfig(test=observed.test, test_files=files)
    return config.model_copy(update={"entrypoint": entrypoint})


def stage_configs(config: TargetConfig, needs_training: bool, reports: list[StageReport]) -> list[TargetConfig]:
    """One configuration per run of a stage: the target's alone, or, for a stage that runs the
    training function where none is configured, one per observed test, in the order they are
    observed; each in its baseline form only where that test was edited."""
    observed = fact(reports)
    if not needs_training or config.entrypoint is not None or observed is None or observed.test is None:
        return [config]
    if not observed.tests:
        return [stage_config(config, needs_training, reports)]
    files = next((r.observed_files for r in reports if r.observed_training is not None), {})
    return [
        config.model_copy(update={"entrypoint": EntrypointConfig(test=t.nodeid, test_files=files if t.baseline_form else {})})
        for t in observed.tests
    ]


def merged(findings: list[list[Finding]]) -> list[Finding]:
    """The findings of each observed test's run (`with_test_named`), one per id: the first
    seen, naming every test that showed it when there were several."""
    by_id: dict[str, Finding] = {}
    tests: defaultdict[str, list[str]] = defaultdict(list)
    for found in findings:
        for f in found:
            by_id.setdefault(f.id, f)
            test = _ObservedIn.model_validate(f.evidence.data).training_test
            if test is not None and test not in tests[f.id]:
                tests[f.id].append(test)
    if len({test for named in tests.values() for test in named}) < 2:
        return list(by_id.values())
    return [_naming(f, tests[f.id]) for f in by_id.values()]


def _naming(finding: Finding, tests: list[str]) -> Finding:
    if not tests:
        return finding
    data = {**finding.evidence.data, TRAINING_TESTS_KEY: tests}
    return finding.model_copy(update={"evidence": finding.evidence.model_copy(update={"data": data})})


def not_measured(config: TargetConfig, needs_training: bool, reports: list[StageReport]) -> str | None:
    """Why a stage that runs the training function is not run, when the only training there
    is made too few optimizer steps for a verdict: it is not measured, never passed."""
    observed = fact(reports)
    if not needs_training or config.entrypoint is not None or observed is None or observed.test is not None:
        return None
    if observed.optimizer_steps is None:
        return None  # no test trained at all: the stage says there is no entrypoint
    return observed.reason


def with_test_named(findings: list[Finding], config: TargetConfig) -> list[Finding]:
    """`findings` of a stage that observed a test's training, each naming that test in its
    evidence (the id does not change: it never depends on the evidence)."""
    ep = config.entrypoint
    if ep is None or ep.test is None:
        return findings
    named = {TRAINING_TEST_KEY: ep.test, **({"baseline_form": True} if ep.test_files else {})}
    return [f.model_copy(update={"evidence": f.evidence.model_copy(update={"data": {**f.evidence.data, **named}})}) for f in findings]
