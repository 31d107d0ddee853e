"""The line at the top of the performance page when a timing could not be judged against the
baseline: a step time that is not comparable or not measured neither blocks nor passes, and a
reader who sees PASS must not take it for a timing that was compared."""

from __future__ import annotations

from traingate.stages.performance.details import RegressionDetails


def timing_notice(baseline_given: bool, regression: RegressionDetails | None) -> str | None:
    """One paragraph naming each timing not compared with the baseline and why; None where
    every timing was compared (or no baseline was given)."""
    if not baseline_given or regression is None:
        return None
    parts = []
    side = regression.side_by_side
    if side is not None and side.verdict == "not measured":
        parts.append(f"the step time ({side.label}) timed beside the baseline's code (commit {side.commit[:12]}) was not measured: {side.reason}")
    parts += [f"{row.metric} is not comparable with the baseline report's: {row.reason}" for row in regression.not_comparable]
    if not parts:
        return None
    lead = "Timings not compared with the baseline"
    if regression.side_by_side is None and regression.side_by_side_note:
        lead += f" (the baseline's code was not timed beside this version's: {regression.side_by_side_note})"
    return f"{lead}: " + "; ".join(parts) + ". These neither block nor pass: no step-time regression was judged for them."
