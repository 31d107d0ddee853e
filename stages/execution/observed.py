"""Which test's training the later stages observe when no entrypoint is configured.

The tests that step an optimizer are the repo's training runs. Of those that passed in the
suite's run, the one that made the most optimizer steps is observed (fewer steps first on a
tie broken by duration, then by node id); one with fewer than `MIN_OBSERVED_STEPS` is not
enough for a verdict, and the stages say "not measured". With a `--baseline` whose report
observed a test, that test is observed again, whatever this version's suite did with it, and
in its baseline form when this version changed its test code (the replay's plan says so): a
change cannot stop being observed by editing or deleting its tests, or by adding a test that
steps more.
"""

from __future__ import annotations

from traingate.pipeline.model.schema import ObservedTraining, PipelineReport, TestRecord, TrainingTest
from traingate.stages.base import StageContext
from traingate.stages.execution.replay import NotReplayed, ReplayPlan

# Gradients carried from one step to the next, memory held between steps and the loss's fall
# all need steps after the first two.
MIN_OBSERVED_STEPS = 3
MAX_CANDIDATES = 20


def training_tests(records: list[TestRecord]) -> list[TrainingTest]:
    """The tests that passed after making optimizer steps, the most steps first."""
    trained = [TrainingTest(nodeid=r.nodeid, optimizer_steps=r.optimizer_steps, duration_s=r.duration_s) for r in records if r.outcome == "passed" and r.optimizer_steps > 0]
    return sorted(trained, key=lambda t: (-t.optimizer_steps, t.duration_s, t.nodeid))


def baseline_observed(baseline: PipelineReport | None) -> str | None:
    """The test the baseline's report observed; None without one."""
    if baseline is None or baseline.observed_training is None:
        return None
    return baseline.observed_training.test


def choose(ctx: StageContext, records: list[TestRecord], plan: ReplayPlan | NotReplayed | None) -> tuple[ObservedTraining | None, dict[str, str | None]]:
    """The observed test, why, and the baseline's files it runs with (empty: as this version
    has it); None with an entrypoint configured (nothing changes then) or no suite run."""
    if ctx.config.entrypoint is not None or not ctx.config.has_test_suite:
        return None, {}
    candidates = training_tests(records)
    shown = candidates[:MAX_CANDIDATES]
    again = baseline_observed(ctx.baseline)
    if again is not None:
        return _again(again, candidates, plan, _version(ctx))
    if not candidates:
        reason = "no test that passed made an optimizer step in the suite's run: there is no training to observe"
        return ObservedTraining(test=None, reason=reason, min_steps=MIN_OBSERVED_STEPS), {}
    best = candidates[0]
    if best.optimizer_steps < MIN_OBSERVED_STEPS:
        reason = (
            f"not measured: the test that trained most, {best.nodeid}, made {best.optimizer_steps} optimizer step(s), "
            f"fewer than the {MIN_OBSERVED_STEPS} a verdict needs"
        )
        return ObservedTraining(test=None, optimizer_steps=best.optimizer_steps, reason=reason, min_steps=MIN_OBSERVED_STEPS, candidates=shown), {}
    others = f"; {len(candidates) - 1} other test(s) trained with as many or fewer" if len(candidates) > 1 else ""
    reason = f"this test made the most optimizer steps ({best.optimizer_steps}) of the tests that passed{others}"
    return ObservedTraining(test=best.nodeid, optimizer_steps=best.optimizer_steps, reason=reason, min_steps=MIN_OBSERVED_STEPS, candidates=shown), {}


def _again(nodeid: str, candidates: list[TrainingTest], plan: ReplayPlan | NotReplayed | None, version: str) -> tuple[ObservedTraining, dict[str, str | None]]:
    """The baseline's observed test, observed again: in its baseline form where this version
    changed its test code."""
    path = nodeid.split("::", 1)[0]
    now = next((c for c in candidates if c.nodeid == nodeid), None)
    reason = f"{version} observed this test's training: a baseline's training test is observed again"
    files: dict[str, str | None] = {}
    if isinstance(plan, ReplayPlan) and path in plan.files:
        files = dict(plan.overlay)
        reason += f", in its baseline form, since this version changed its test code ({', '.join(plan.changed.get(path, [path])[:5])})"
    elif isinstance(plan, NotReplayed):
        reason += f", as this version has it (its baseline form could not be read: {plan.reason})"
    if now is None:
        reason += "; in this version's suite it made no optimizer step or did not pass"
    shown = candidates[:MAX_CANDIDATES]
    return ObservedTraining(
        test=nodeid, optimizer_steps=now.optimizer_steps if now else None, reason=reason, baseline_form=bool(files),
        min_steps=MIN_OBSERVED_STEPS, candidates=shown,
    ), files


def _version(ctx: StageContext) -> str:
    version = ctx.baseline.version if ctx.baseline is not None else ""
    return f"the baseline ({version})" if version else "the baseline"
