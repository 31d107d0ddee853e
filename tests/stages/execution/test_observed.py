"""With no entrypoint configured, the stages observe the training of several tests: those that
stepped at optimizer-step sites no test picked before them reached, the most steps first, up
to `observe_tests` (docs/stages.md). A bug in a training loop that only the less-stepped test
drives is found and names that test; a clean control with the same two loops passes; a second
test that drives the same loop is not observed and is listed as such.

The choice, the split of a stage's budget and the merge of findings are checked in process; the
fixture targets are each run once (`shared_gate`) for every assertion that reads them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TARGETS, GateRun, line_of
from traingate.pipeline.gate import observed_runs, observed_tests
from traingate.pipeline.gate.config_diff import NARROWS, differences
from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.model.schema import (
    Category,
    Decision,
    Environment,
    Evidence,
    EvidenceKind,
    Finding,
    NotObserved,
    ObservedRun,
    ObservedTest,
    ObservedTraining,
    PipelineReport,
    Severity,
    StageOutcome,
    StageReport,
    StageStatus,
    TargetInfo,
    TestRecord,
    TrainingTest,
)
from traingate.reports.render import render_report_md, render_stage_md
from traingate.stages.base import StageContext
from traingate.stages.execution.observed import choose, pick
from traingate.stages.execution.replay import ReplayPlan

OBSERVING = ("performance", "concurrency", "correctness")
CLASSIFIER = "tests/test_a.py::test_classifier_trains_six_steps"
REGRESSOR = "tests/test_b.py::test_regressor_trains_four_steps"
LONG = "tests/test_loop.py::test_train_eight_steps"
SHORT = "tests/test_loop.py::test_train_five_steps_of_larger_batches"


def _test(nodeid: str, steps: int, *sites: str, duration: float = 1.0) -> TrainingTest:
    return TrainingTest(nodeid=nodeid, optimizer_steps=steps, duration_s=duration, step_sites=list(sites))


# -- the choice ------------------------------------------------------------------------------


def test_tests_at_distinct_sites_are_picked_the_most_steps_first_up_to_the_limit() -> None:
    candidates = [
        _test("t.py::a", 9, "a.py:5"), _test("t.py::a_again", 8, "a.py:5"), _test("t.py::b", 6, "b.py:7"),
        _test("t.py::both", 5, "a.py:5", "b.py:7"), _test("t.py::c", 4, "c.py:3"), _test("t.py::d", 4, "d.py:1"), _test("t.py::tiny", 2, "e.py:1"),
    ]
    picked, passed_over = pick(candidates, limit=3)
    assert [t.nodeid for t in picked] == ["t.py::a", "t.py::b", "t.py::c"]
    assert "most optimizer steps (9)" in picked[0].reason and "a.py:5" in picked[0].reason
    assert "b.py:7" in picked[1].reason and "no test picked before it reached" in picked[1].reason
    why = {n.nodeid: n.reason for n in passed_over}
    assert list(why) == ["t.py::a_again", "t.py::both", "t.py::d", "t.py::tiny"]
    assert why["t.py::a_again"].startswith("same site as t.py::a") and "a.py:5" in why["t.py::a_again"]
    assert why["t.py::both"].startswith("same site as t.py::a")  # both of its sites were reached already
    assert why["t.py::d"].startswith("limit 3") and "d.py:1" in why["t.py::d"]
    assert why["t.py::tiny"].startswith("fewer steps: 2 optimizer step(s)")


def test_the_choice_is_the_same_whatever_order_the_tests_ran_in(tmp_path: Path) -> None:
    records = [
        TestRecord(nodeid="t.py::z", outcome="passed", optimizer_steps=5, step_sites=["z.py:1"], duration_s=1.0),
        TestRecord(nodeid="t.py::y", outcome="passed", optimizer_steps=5, step_sites=["y.py:1"], duration_s=1.0),
        TestRecord(nodeid="t.py::x", outcome="passed", optimizer_steps=5, step_sites=["x.py:1"], duration_s=1.0),
    ]
    ctx = StageContext(stage="execution", root=tmp_path, config=TargetConfig(observe_tests=2), device="cpu", deadline=time.time() + 60, scratch=tmp_path / "s")
    first, _ = choose(ctx, records, None)
    second, _ = choose(ctx, records[::-1], None)
    assert first is not None and second is not None and first == second
    assert [t.nodeid for t in first.tests] == ["t.py::x", "t.py::y"] and first.test == "t.py::x" and first.limit == 2
    assert [(n.nodeid, n.reason.split(":")[0]) for n in first.not_observed] == [("t.py::z", "limit 2")]


def test_the_limit_is_a_key_whose_lowering_narrows_what_is_verified() -> None:
    assert TargetConfig().observe_tests == 3
    with pytest.raises(ValueError):
        TargetConfig(observe_tests=0)
    [lowered] = differences(TargetConfig(), None, TargetConfig(observe_tests=1), None, pinned_suite=True)
    assert (lowered.key, lowered.effect) == ("observe_tests", NARROWS)


def test_no_tests_set_is_pytests_discovery_and_paths_given_narrow_it() -> None:
    assert TargetConfig().tests is None and TargetConfig().has_test_suite
    assert "pytest collects" in TargetConfig().tests_described()
    [given] = differences(TargetConfig(), None, TargetConfig(tests=["tests/test_a.py"]), None, pinned_suite=False)
    assert (given.key, given.effect) == ("tests", NARROWS)
    [unset] = differences(TargetConfig(tests=["tests"]), None, TargetConfig(), None, pinned_suite=False)
    assert unset.key == "tests" and unset.effect != NARROWS


def test_each_observed_test_gets_a_configuration_in_its_own_form() -> None:
    tests = [ObservedTest(nodeid="a.py::t", optimizer_steps=6, reason="r", baseline_form=True), ObservedTest(nodeid="b.py::t", optimizer_steps=4, reason="r")]
    observed = ObservedTraining(test="a.py::t", optimizer_steps=6, reason="r", min_steps=3, tests=tests)
    reports = [StageReport(name="execution", status=StageStatus.PASSED, score=100, duration_s=1, summary="", observed_training=observed, observed_files={"a.py": "old"})]
    configs = observed_tests.stage_configs(TargetConfig(), True, reports)
    assert [(c.entrypoint.test, c.entrypoint.test_files) for c in configs if c.entrypoint] == [("a.py::t", {"a.py": "old"}), ("b.py::t", {})]
    assert observed_tests.stage_configs(TargetConfig(), False, reports) == [TargetConfig()]
    configured = TargetConfig(entrypoint=EntrypointConfig(call="train:train"))
    assert observed_tests.stage_configs(configured, True, reports) == [configured]


# -- the runs in turn and their merge ----------------------------------------------------------


def _config(test: str) -> TargetConfig:
    return TargetConfig(entrypoint=EntrypointConfig(test=test))


def test_the_budget_is_split_fairly_and_a_test_without_a_share_is_not_reached() -> None:
    shares: list[float] = []

    def run(config: TargetConfig, share: float, index: int) -> float:
        shares.append(share)
        return 0.0

    done, records = observed_runs.in_turn([_config("a"), _config("b"), _config("c")], 90.0, run, lambda r: r)
    assert len(done) == 3 and shares[0] == pytest.approx(30.0, abs=0.5)
    assert shares[1] == pytest.approx(45.0, abs=0.5)  # the first took no time: its rest goes to the others
    assert all(r.reached for r in records)

    def slow(config: TargetConfig, share: float, index: int) -> float:
        time.sleep(0.3)
        return 0.3

    done, records = observed_runs.in_turn([_config("a"), _config("b")], observed_runs.MIN_SHARE_S + 0.2, slow, lambda r: r)
    assert [c.entrypoint.test for c, _ in done if c.entrypoint] == ["a"]
    assert [(r.nodeid, r.reached) for r in records] == [("a", True), ("b", False)]
    assert records[1].note.startswith("not reached:")


def _finding(line: int, test: str) -> Finding:
    found = Finding.create(
        stage="correctness", category=Category("stale-gradients"), severity=Severity.HIGH, title="t", location=None, problem=f"p{line}",
        impact="i", fix="f", evidence=Evidence(kind=EvidenceKind.OBSERVED, data={"line": line}), block_on=[Severity.HIGH],
    )
    return observed_tests.with_test_named([found], _config(test))[0]


def test_a_finding_several_tests_showed_is_reported_once_naming_each() -> None:
    same_a, same_b = _finding(1, "a.py::t"), _finding(1, "b.py::t")
    assert same_a.id == same_b.id
    merged = observed_tests.merged([[same_a], [same_b]])
    assert len(merged) == 1 and merged[0].evidence.data["training_test"] == "a.py::t"
    assert merged[0].evidence.data["training_tests"] == ["a.py::t", "b.py::t"]
    one = observed_tests.merged([[same_a], []])
    assert one == [same_a]  # one test showed it: named as with one test observed


def test_the_merged_outcome_is_skipped_only_when_every_run_was() -> None:
    skipped = StageOutcome(summary="s", skipped_reason="nothing")
    ran = StageOutcome(summary="ran", details={"k": 1})
    merged = observed_runs.merged_outcome([("a", skipped), ("b", ran)])
    assert merged.skipped_reason is None and merged.details == {"k": 1} and "metrics and details from b" in merged.summary
    assert observed_runs.merged_outcome([("a", skipped), ("b", skipped)]).skipped_reason == "nothing"


# -- gate runs on the fixture targets ----------------------------------------------------------


@pytest.fixture
def two_loops_bug(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("observe_two_loops_bug", "--stages", "execution,correctness")[0]


@pytest.fixture
def two_loops_clean(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("observe_two_loops_clean", "--stages", "execution,performance,concurrency,correctness")[0]


@pytest.fixture
def shared_trainer(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("observe_shared_trainer", "--stages", "execution,correctness")[0]


@pytest.fixture
def same_loop(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("observe_same_loop", "--stages", "execution,correctness")[0]


def _observing(run: GateRun) -> list[dict[str, Any]]:
    return [f for s in run.report["stages"] if s["name"] in OBSERVING for f in s["findings"]]


def test_the_bug_in_the_less_stepped_loop_blocks_at_its_line_naming_its_test(two_loops_bug: GateRun) -> None:
    run = two_loops_bug
    observed = run.report["observed_training"]
    assert [(t["nodeid"], t["optimizer_steps"]) for t in observed["tests"]] == [(CLASSIFIER, 6), (REGRESSOR, 4)]
    [site] = observed["tests"][1]["step_sites"]
    assert site.startswith(f"regressor.py:{line_of(TARGETS / 'observe_two_loops_bug' / 'regressor.py', 'marker: step')} (parameters ")
    assert observed["not_observed"] == []
    [stale] = run.findings("stale-gradients")
    assert (stale["location"]["path"], stale["location"]["line"]) == ("regressor.py", line_of(TARGETS / "observe_two_loops_bug" / "regressor.py", "marker: step"))
    assert stale["blocking"] and stale["evidence"]["data"]["training_test"] == REGRESSOR
    assert not [f for f in _observing(run) if (f["location"] or {}).get("path") == "classifier.py"]
    assert run.report["decision"] == "BLOCK"
    assert [(r["nodeid"], r["reached"]) for r in run.stage("correctness")["observed_runs"]] == [(CLASSIFIER, True), (REGRESSOR, True)]


def test_the_report_says_which_tests_were_observed_and_why(two_loops_bug: GateRun) -> None:
    report_md = (two_loops_bug.out / "report.md").read_text()
    assert f"`{CLASSIFIER}`" in report_md and f"`{REGRESSOR}`" in report_md and "Step site" in report_md
    page = next(p for p in two_loops_bug.out.rglob("*.md") if p.name != "report.md" and "correctness" in p.name.lower())
    assert "## Training observed" in page.read_text() and f"`{REGRESSOR}`" in page.read_text()
    assert f"training observed: {REGRESSOR}" in two_loops_bug.stdout


def test_the_same_two_loops_clean_pass_in_every_observing_stage(two_loops_clean: GateRun) -> None:
    run = two_loops_clean
    assert run.report["decision"] == "PASS", run.stdout
    assert [t["nodeid"] for t in run.report["observed_training"]["tests"]] == [CLASSIFIER, REGRESSOR]
    for name in OBSERVING:
        stage = run.stage(name)
        assert stage["status"] != "skipped", (name, stage.get("skipped_reason"))
        assert [(r["nodeid"], r["reached"]) for r in stage["observed_runs"]] == [(CLASSIFIER, True), (REGRESSOR, True)], name
    assert not [f for f in _observing(run) if f["blocking"]]


def test_a_second_test_of_the_same_loop_is_not_observed_and_listed_as_such(same_loop: GateRun) -> None:
    run = same_loop
    observed = run.report["observed_training"]
    assert [t["nodeid"] for t in observed["tests"]] == [LONG]
    [other] = observed["not_observed"]
    assert other["nodeid"] == SHORT and other["optimizer_steps"] == 5
    assert other["reason"].startswith(f"same site as {LONG}") and f"loop.py:{line_of(TARGETS / 'observe_same_loop' / 'loop.py', 'marker: step')}" in other["reason"]
    [stale] = run.findings("stale-gradients")
    assert (stale["location"]["path"], stale["location"]["line"]) == ("loop.py", line_of(TARGETS / "observe_same_loop" / "loop.py", "marker: step"))
    assert stale["evidence"]["data"]["training_test"] == LONG and "training_tests" not in stale["evidence"]["data"]
    assert run.report["decision"] == "BLOCK"
    assert [r["nodeid"] for r in run.stage("correctness")["observed_runs"]] == [LONG]
    assert f"`{SHORT}`" in (run.out / "report.md").read_text()


def test_one_loop_that_fits_two_models_is_two_sites_and_the_bad_model_blocks(shared_trainer: GateRun) -> None:
    run, target = shared_trainer, TARGETS / "observe_shared_trainer"
    observed = run.report["observed_training"]
    good, bad = "tests/test_models.py::test_classifier_fits_six_steps", "tests/test_models.py::test_scored_classifier_fits_four_steps"
    assert [t["nodeid"] for t in observed["tests"]] == [good, bad] and observed["not_observed"] == []
    step = f"trainer.py:{line_of(target / 'trainer.py', 'marker: step')} (parameters "
    [first], [second] = (t["step_sites"] for t in observed["tests"])
    assert first.startswith(step) and second.startswith(step) and first != second  # the same line, two models
    [mismatch] = run.findings("loss-input-mismatch")
    assert (mismatch["location"]["path"], mismatch["location"]["line"]) == ("trainer.py", line_of(target / "trainer.py", "marker: loss"))
    assert f"models.py:{line_of(target / 'models.py', 'marker: softmax')}" in mismatch["title"]
    assert mismatch["blocking"] and mismatch["evidence"]["data"]["training_test"] == bad
    assert run.report["decision"] == "BLOCK"


def test_a_test_not_reached_is_said_in_the_report_and_on_the_stage_page() -> None:
    tests = [ObservedTest(nodeid="a.py::t", optimizer_steps=9, step_sites=["a.py:5"], reason="most"), ObservedTest(nodeid="b.py::t", optimizer_steps=4, reason="site")]
    observed = ObservedTraining(
        test="a.py::t", optimizer_steps=9, reason="most", min_steps=3, tests=tests, limit=2,
        not_observed=[NotObserved(nodeid="c.py::t", optimizer_steps=8, reason="same site as a.py::t")],
    )
    runs = [ObservedRun(nodeid="a.py::t", reached=True, duration_s=50.0, budget_s=60.0), ObservedRun(nodeid="b.py::t", reached=False, budget_s=5.0, note="not reached: 9 s left")]
    stage = StageReport(name="correctness", status=StageStatus.PASSED, score=100, duration_s=50, summary="s", observed_runs=runs)
    report = PipelineReport(
        tool_version="0", task="t", version="v1", target=TargetInfo(path="."), environment=Environment(python="3", torch=None, device="cpu", device_name="cpu"),
        started_at="", duration_s=0, decision=Decision.PASS, score=100, stages=[stage], observed_training=observed,
    )
    text = render_report_md(report)
    assert "- **correctness**: `b.py::t` not reached: 9 s left; its training was not observed in this stage." in text
    assert "| `c.py::t` | 8 | same site as a.py::t |" in text and "| `a.py::t` | 9 | a.py:5 | most |" in text
    page = render_stage_md(report, stage)
    assert "| `b.py::t` | not reached: 9 s left | 5 s |" in page


def test_the_baselines_tests_are_each_observed_again_in_their_own_form(tmp_path: Path) -> None:
    picked = [ObservedTest(nodeid="tests/test_a.py::fit", optimizer_steps=6, reason="r"), ObservedTest(nodeid="tests/test_b.py::fit", optimizer_steps=4, reason="r")]
    baseline = PipelineReport(
        tool_version="0", task="t", version="v1", target=TargetInfo(path="."), environment=Environment(python="3", torch=None, device="cpu", device_name="cpu"),
        started_at="", duration_s=0, decision=Decision.PASS, score=100, stages=[],
        observed_training=ObservedTraining(test="tests/test_a.py::fit", optimizer_steps=6, reason="r", min_steps=3, tests=picked),
    )
    plan = ReplayPlan(commit="c", files=["tests/test_b.py"], tests=[], overlay={"tests/test_b.py": "old"}, changed={"tests/test_b.py": ["tests/test_b.py"]})
    # This version: test_b edited down to one step, and a decoy that steps more elsewhere.
    records = [
        TestRecord(nodeid="tests/test_a.py::fit", outcome="passed", optimizer_steps=6, step_sites=["a.py:3"]),
        TestRecord(nodeid="tests/test_b.py::fit", outcome="passed", optimizer_steps=1, step_sites=["b.py:3"]),
        TestRecord(nodeid="tests/test_c.py::decoy", outcome="passed", optimizer_steps=500, step_sites=["c.py:3"]),
    ]
    ctx = StageContext(stage="execution", root=tmp_path, config=TargetConfig(observe_tests=1), device="cpu", deadline=time.time() + 60, scratch=tmp_path / "s", baseline=baseline)
    observed, files = choose(ctx, records, plan)
    assert observed is not None and [(t.nodeid, t.baseline_form) for t in observed.tests] == [("tests/test_a.py::fit", False), ("tests/test_b.py::fit", True)]
    assert observed.limit == 2 and files == {"tests/test_b.py": "old"}  # the baseline's two, past this version's limit of one
    reports = [StageReport(name="execution", status=StageStatus.PASSED, score=100, duration_s=1, summary="", observed_training=observed, observed_files=files)]
    configs = observed_tests.stage_configs(TargetConfig(), True, reports)
    assert [(c.entrypoint.test, c.entrypoint.test_files) for c in configs if c.entrypoint] == [("tests/test_a.py::fit", {}), ("tests/test_b.py::fit", {"tests/test_b.py": "old"})]


def test_each_training_loop_is_observed_before_a_second_model_of_another_loop() -> None:
    """A GAN trained by five tests at one loop, and three tests training three models through
    another shared loop, each making more steps: every loop gets a slot first."""
    shared = [TrainingTest(nodeid=f"tests/test_ae.py::test_{n}", optimizer_steps=20 - n, duration_s=1.0, step_sites=[f"ae.py:30 (parameters {n}a{n}b{n}c0)"]) for n in range(3)]
    gan = [TrainingTest(nodeid=f"tests/test_gan.py::test_{n}", optimizer_steps=8, duration_s=1.0 + n, step_sites=["gan.py:88 (parameters 99887766)"]) for n in range(5)]
    picked, passed_over = pick([*shared, *gan], 3)
    assert [t.nodeid for t in picked] == ["tests/test_ae.py::test_0", "tests/test_gan.py::test_0", "tests/test_ae.py::test_1"]
    reasons = {t.nodeid: t.reason for t in passed_over}
    assert reasons["tests/test_ae.py::test_2"].startswith("limit 3") and reasons["tests/test_gan.py::test_1"].startswith("same site as tests/test_gan.py::test_0")


def test_the_tests_past_the_limit_are_named_in_the_terminal_and_the_step_summary() -> None:
    from tests.report_builders import report, stage
    from traingate.pipeline.gate.outputs import RunFacts
    from traingate.pipeline.model.schema import NotObserved
    from traingate.reports import render_summary
    from traingate.reports.step_summary import render_step_summary

    left = NotObserved(nodeid="tests/test_gan.py::test_gan", optimizer_steps=8, reason="limit 3: 3 test(s) were observed already (observe_tests); it stepped at gan.py:88")
    observed = ObservedTraining(test="a.py::t", optimizer_steps=6, reason="r", min_steps=3, not_observed=[left], limit=3)
    shown = report([stage("execution")]).model_copy(update={"observed_training": observed})
    line = "1 test(s) past the limit, e.g. tests/test_gan.py::test_gan; raise `observe_tests` (now 3)"
    assert line in render_summary(shown) and line in render_step_summary(shown, RunFacts())
    quiet = report([stage("execution")]).model_copy(update={"observed_training": observed.model_copy(update={"not_observed": []})})
    assert "past the limit" not in render_summary(quiet)
