"""`traingate init` where the repo's tests train: no entry point is proposed, since one would
turn off the observation of the tests' training (docs/stages.md, "Which loops are observed").

The check runs what `traingate run` runs with no configuration (the suite pytest collects, and
the step-checking stage on the tests the execution stage picks); the file then asks for as many
observed tests as the suite's tests stepped at distinct loops, where that is more than the
default.
"""

from __future__ import annotations

from pathlib import Path

from traingate.pipeline.gate.init_check import CheckResult, InitOutcome, run_check
from traingate.pipeline.gate.init_propose import Candidate
from traingate.pipeline.gate.init_scan import Found, is_test
from traingate.pipeline.gate.init_toml import check_written, top_lines
from traingate.pipeline.model.config import MAX_OBSERVED_TESTS, TargetConfig
from traingate.pipeline.model.registry import step_checking_stage, stages_observing_tests
from traingate.pipeline.model.schema import ObservedTraining

DEFAULT_OBSERVED = TargetConfig.model_fields["observe_tests"].default


def observe_tests(root: Path, found: Found, listed: list[Candidate], *, device: str, check: bool, budget_s: float) -> InitOutcome:
    tests = sorted((f for f in found.training() if is_test(f)), key=lambda f: (f.path, f.line))
    result = None
    if check:
        # As an unconfigured run observes (the default number of tests): the loops are counted
        # from every test that stepped in the suite, observed or not.
        result = run_check(root, {"timeout_s": budget_s}, stages_observing_tests(), device)
    observed = result.observed if result is not None else None
    loops = len(training_loops(observed)) if observed is not None else 0
    verified = result is not None and not result.problems and observed is not None and observed.test is not None
    shown = ", ".join(f"{f.path}:{f.line} ({f.qualname})" for f in tests[:3]) + (f", and {len(tests) - 3} more" if len(tests) > 3 else "")
    lines = [
        "traingate's configuration, written by `traingate init` (each key: docs/configuration.md).",
        f"The repo's tests train: {len(tests)} test function(s) reach a training loop ({shown}).",
        "With no [entrypoint], the gate observes the training those tests run; an entrypoint would turn that off.",
        _check_line(result, loops, verified),
    ]
    others = [c for c in listed if c.kind != "test"][:3]
    if others:
        lines.append("Entry points found, not configured: " + "; ".join(f"{c.label} ({c.where})" for c in others) + ".")
    keys = [f"observe_tests = {min(loops, MAX_OBSERVED_TESTS)}   # the training loops the check found the tests driving"] if loops > DEFAULT_OBSERVED else []
    unverified = None if verified else _why_not(result)
    text = "\n".join(top_lines(lines, keys, unverified)) + "\n"
    messages = lines[1:]
    invalid = check_written(text, root)
    if invalid is not None:
        messages.append(f"The file as written does not load: {invalid}")
    return InitOutcome(text, None, result, messages, verified=verified)


def training_loops(observed: ObservedTraining) -> set[str]:
    """The distinct loops the suite's tests stepped at: a step site's line, whatever model it
    stepped (as the execution stage plans the observation)."""
    return {site.split(" (parameters ", 1)[0] for test in observed.candidates for site in (test.step_sites or [test.nodeid])}


def _check_line(result: CheckResult | None, loops: int, verified: bool) -> str:
    if result is None:
        return "Not checked: --no-check was given."
    observed = result.observed
    if not verified or observed is None:
        return f"The check run fell short: {_why_not(result)}"
    return (
        f"Checked: the suite ran; its tests step at {loops} training loop(s), {len(observed.tests)} test(s) observed "
        f"({observed.test} first, {result.steps} optimizer steps under the {step_checking_stage()} stage's probes) in {result.duration_s:.0f} s."
    )


def _why_not(result: CheckResult | None) -> str:
    if result is None:
        return "the tests' training was not checked: --no-check was given"
    if result.problems:
        more = f" (and {len(result.problems) - 1} more in the check's report)" if len(result.problems) > 1 else ""
        return (result.problems[0][:400] + more)
    observed = result.observed
    return (observed.reason if observed is not None else "the execution stage named no test whose training to observe")[:500]
