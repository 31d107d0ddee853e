"""Which tests' training the later stages observe when no entrypoint is configured.

The tests that step an optimizer are the repo's training runs. Of those that passed in the
suite's run, taken the most optimizer steps first (a tie: the shorter, then by node id), a test
is observed when it stepped at a site no test picked before it reached (`TestRecord.step_sites`:
a second test that drives the same loop adds nothing), up to `observe_tests` of them; one with
fewer than `MIN_OBSERVED_STEPS` is not enough for a verdict, and when the test that trained
most has too few the stages say "not measured". With a `--baseline` whose report observed
tests, those are observed again, whatever this version's suite did with them, each in its
baseline form when this version changed its test code (the replay's plan says so): a change
cannot stop being observed by editing or deleting its tests, or by adding tests that step more.
"""

from __future__ import annotations

from traingate.pipeline.model.schema import NotObserved, ObservedTest, ObservedTraining, PipelineReport, TestRecord, TrainingTest
from traingate.stages.base import StageContext
from traingate.stages.execution.replay import NotReplayed, ReplayPlan

# Gradients carried from one step to the next, memory held between steps and the loss's fall
# all need steps after the first two.
MIN_OBSERVED_STEPS = 3
MAX_CANDIDATES = 20


def training_tests(records: list[TestRecord]) -> list[TrainingTest]:
    """The tests that passed after making optimizer steps, the most steps first."""
    trained = [
        TrainingTest(nodeid=r.nodeid, optimizer_steps=r.optimizer_steps, duration_s=r.duration_s, step_sites=r.step_sites)
        for r in records if r.outcome == "passed" and r.optimizer_steps > 0
    ]
    return sorted(trained, key=lambda t: (-t.optimizer_steps, t.duration_s, t.nodeid))


def baseline_observed(baseline: PipelineReport | None) -> list[str]:
    """The tests the baseline's report observed, in its order; empty without one."""
    if baseline is None or baseline.observed_training is None:
        return []
    observed = baseline.observed_training
    named = [t.nodeid for t in observed.tests] or ([observed.test] if observed.test else [])
    return list(dict.fromkeys(named))


def pick(candidates: list[TrainingTest], limit: int) -> tuple[list[ObservedTest], list[NotObserved]]:
    """The tests observed, in `candidates`' order, and the others with why not: too few steps,
    no step site that a test picked before did not reach, or `limit` reached.

    Planned by loop: a step site is a line and the shapes of the model it stepped, and its loop
    the line alone. First each distinct loop gets one test, the most steps first (three tests
    training three models through one shared loop cannot take every slot from another loop);
    then the slots left go to the tests that reach a (line, model) no test picked reached."""
    picked: list[ObservedTest] = []
    reached: dict[str, str] = {}  # step site -> the picked test that stepped there
    loops: set[str] = set()
    chosen: set[str] = set()
    for first_pass in (True, False):
        for test in candidates:
            sites = test.step_sites or [test.nodeid]  # no site of the target's code: a loop of its own
            new = [site for site in sites if site not in reached]
            if test.nodeid in chosen or _not_picked(test, new, "", sites[0], len(picked), limit) is not None:
                continue
            if first_pass and not {_loop(site) for site in new} - loops:
                continue  # its loop has a test already: it may take a slot left in the second pass
            reason = (
                f"this test made the most optimizer steps ({test.optimizer_steps}) of the tests that passed{_at(test, new)}" if not picked
                else f"{test.optimizer_steps} optimizer steps{_at(test, new)}, " + ("a training loop no test picked before it reached" if first_pass else "a step site (its loop, another model) no test picked before it reached")
            )
            picked.append(ObservedTest(nodeid=test.nodeid, optimizer_steps=test.optimizer_steps, step_sites=test.step_sites, reason=reason))
            chosen.add(test.nodeid)
            reached.update({site: test.nodeid for site in sites if site not in reached})
            loops.update(_loop(site) for site in sites)
    passed_over = []
    for test in candidates:
        if test.nodeid in chosen:
            continue
        sites = test.step_sites or [test.nodeid]
        new = [site for site in sites if site not in reached]
        why = _not_picked(test, new, reached.get(sites[0], ""), sites[0], len(picked), limit) or "not observed"
        passed_over.append(NotObserved(nodeid=test.nodeid, optimizer_steps=test.optimizer_steps, reason=why))
    return picked, passed_over


def _loop(site: str) -> str:
    """A step site's loop: its line, whatever model it stepped (`path:line (parameters d1a2)`)."""
    return site.split(" (parameters ", 1)[0]


def _not_picked(test: TrainingTest, new: list[str], first: str, site: str, picked: int, limit: int) -> str | None:
    if test.optimizer_steps < MIN_OBSERVED_STEPS:
        return f"fewer steps: {test.optimizer_steps} optimizer step(s), fewer than the {MIN_OBSERVED_STEPS} a verdict needs"
    if not new:
        return f"same site as {first}: it stepped only where that test did ({site}), so observing it adds no training loop"
    if picked >= limit:
        return f"limit {limit}: {limit} test(s) were observed already (observe_tests); it stepped at {new[0]}"
    return None


def _at(test: TrainingTest, new: list[str]) -> str:
    return f", at {new[0]}" if test.step_sites else ""


def choose(ctx: StageContext, records: list[TestRecord], plan: ReplayPlan | NotReplayed | None) -> tuple[ObservedTraining | None, dict[str, str | None]]:
    """The observed tests, why, and the baseline's files they run with in their baseline form
    (empty: as this version has them); None with an entrypoint configured (nothing changes
    then) or no suite run."""
    if ctx.config.entrypoint is not None or not ctx.config.has_test_suite:
        return None, {}
    candidates = training_tests(records)
    shown = candidates[:MAX_CANDIDATES]
    limit = ctx.config.observe_tests
    again = baseline_observed(ctx.baseline)
    if again:
        return _again(again, candidates, plan, _version(ctx), limit)
    if not candidates:
        reason = "no test that passed made an optimizer step in the suite's run: there is no training to observe"
        return ObservedTraining(test=None, reason=reason, min_steps=MIN_OBSERVED_STEPS, limit=limit), {}
    best = candidates[0]
    if best.optimizer_steps < MIN_OBSERVED_STEPS:
        reason = (
            f"not measured: the test that trained most, {best.nodeid}, made {best.optimizer_steps} optimizer step(s), "
            f"fewer than the {MIN_OBSERVED_STEPS} a verdict needs"
        )
        return ObservedTraining(test=None, optimizer_steps=best.optimizer_steps, reason=reason, min_steps=MIN_OBSERVED_STEPS, candidates=shown, limit=limit), {}
    picked, passed_over = pick(candidates, limit)
    others = f"; {len(candidates) - 1} other test(s) trained with as many or fewer" if len(candidates) > 1 else ""
    return ObservedTraining(
        test=best.nodeid, optimizer_steps=best.optimizer_steps, reason=picked[0].reason + others, min_steps=MIN_OBSERVED_STEPS,
        candidates=shown, tests=picked, not_observed=passed_over, limit=limit,
    ), {}


def _again(
    nodeids: list[str], candidates: list[TrainingTest], plan: ReplayPlan | NotReplayed | None, version: str, limit: int,
) -> tuple[ObservedTraining, dict[str, str | None]]:
    """The baseline's observed tests, observed again: each in its baseline form where this
    version changed its test code (all of them, even past this version's limit: the baseline's
    observation is the floor)."""
    tests = [_again_one(nodeid, candidates, plan, version) for nodeid in nodeids]
    files = dict(plan.overlay) if isinstance(plan, ReplayPlan) and any(t.baseline_form for t in tests) else {}
    first = tests[0]
    return ObservedTraining(
        test=first.nodeid, optimizer_steps=first.optimizer_steps, reason=first.reason, baseline_form=first.baseline_form,
        min_steps=MIN_OBSERVED_STEPS, candidates=candidates[:MAX_CANDIDATES], tests=tests, limit=max(limit, len(tests)),
    ), files


def _again_one(nodeid: str, candidates: list[TrainingTest], plan: ReplayPlan | NotReplayed | None, version: str) -> ObservedTest:
    path = nodeid.split("::", 1)[0]
    now = next((c for c in candidates if c.nodeid == nodeid), None)
    reason = f"{version} observed this test's training: a baseline's training test is observed again"
    baseline_form = isinstance(plan, ReplayPlan) and path in plan.files
    if isinstance(plan, ReplayPlan) and baseline_form:
        reason += f", in its baseline form, since this version changed its test code ({', '.join(plan.changed.get(path, [path])[:5])})"
    elif isinstance(plan, NotReplayed):
        reason += f", as this version has it (its baseline form could not be read: {plan.reason})"
    if now is None:
        reason += "; in this version's suite it made no optimizer step or did not pass"
    return ObservedTest(
        nodeid=nodeid, optimizer_steps=now.optimizer_steps if now else None, step_sites=now.step_sites if now else [], reason=reason, baseline_form=baseline_form,
    )


def _version(ctx: StageContext) -> str:
    version = ctx.baseline.version if ctx.baseline is not None else ""
    return f"the baseline ({version})" if version else "the baseline"
