"""A stage that observes the tests' training runs each observed test in turn, within its own
budget: each test gets an equal share of what is left when it starts (a test that ends early
leaves its rest to the ones after it), and one whose share is too small to run the stage's
checks is not reached, which the stage's report says (`StageReport.observed_runs`). Their
outcomes are merged into the stage's one outcome: the findings of every test (one per id,
`observed_tests.merged`), the metrics and details of the first test that the stage ran to
the end.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.schema import ObservedRun, StageOutcome

# Below this, a stage's agent starts, imports torch and installs its probes with nothing left
# to run the test under them: the test is not reached.
MIN_SHARE_S = 10.0

RunT = TypeVar("RunT")


def in_turn(
    configs: list[TargetConfig], budget_s: float, run: Callable[[TargetConfig, float, int], RunT], duration: Callable[[RunT], float],
) -> tuple[list[tuple[TargetConfig, RunT]], list[ObservedRun]]:
    """`run(config, share, index)` for each observed test's configuration, one after another;
    the first always runs. Returns the runs made and a record per test, reached or not."""
    started = time.monotonic()
    done: list[tuple[TargetConfig, RunT]] = []
    records: list[ObservedRun] = []
    for index, config in enumerate(configs):
        test = config.entrypoint.test if config.entrypoint is not None and config.entrypoint.test else "?"
        left = budget_s - (time.monotonic() - started)
        share = left / (len(configs) - index)
        if index and share < MIN_SHARE_S:
            note = f"not reached: {max(left, 0.0):.0f} s of the stage's {budget_s:.0f} s budget were left for {len(configs) - index} test(s)"
            records.append(ObservedRun(nodeid=test, reached=False, budget_s=round(max(share, 0.0), 1), note=note))
            continue
        result = run(config, share, index)
        done.append((config, result))
        records.append(ObservedRun(nodeid=test, reached=True, duration_s=round(duration(result), 3), budget_s=round(share, 1)))
    return done, records


def merged_outcome(outcomes: list[tuple[str, StageOutcome]]) -> StageOutcome:
    """The stage's outcome over the observed tests' runs (each `(test, outcome)`): skipped only
    when every run skipped; its metrics and details from the first run not skipped."""
    if len(outcomes) == 1:
        return outcomes[0][1]
    ran = [(test, o) for test, o in outcomes if o.skipped_reason is None]
    test, primary = (ran or outcomes)[0]
    stopped = list({(s.finding, s.reason): s for _, o in outcomes for s in o.training_stopped}.values())
    summary = f"{primary.summary} ({len(outcomes)} observed tests run in turn; metrics and details from {test})"
    return primary.model_copy(update={"summary": summary, "findings": [f for _, o in outcomes for f in o.findings], "training_stopped": stopped})
