"""The baseline's code timed beside this version's, on the same machine in the same gate run.

A step time stored in the baseline report was measured on another machine or at another
moment; load on a shared runner makes the same code many times slower. So where the baseline's
commit is in the clone, the stage runs the baseline's entrypoint and this version's alternately,
A, B, A, B (A the baseline), each a timing run with the step clock only, and judges this
version's step time against the baseline's from the runs beside each other.

Each run is summed up by the lower quartile of its step times: load preempts some steps and
not others, and the quicker steps are those it left alone (a slowdown in fewer than a quarter
of the steps is not seen by it). Then, by measure:

- each adjacent pair of runs (A1 B1, B1 A2, A2 B2) gives this version's lower quartile over the
  baseline's, with its bootstrap interval over the steps (stages/performance/spread.py);
- **slower**: in every adjacent pair the interval lies above 1 + THRESHOLD, and the gap between
  the versions (this version's quickest run over the baseline's slowest) is wider than the
  spread between the runs of each version (the slowest of its runs over the quickest). Load
  that rises or falls through the runs makes B slower in one pair and A in the next; a burst of
  load on one run makes that version's runs disagree by more than the gap: neither is slower;
- **not slower**: in every pair the interval lies at or under 1 + THRESHOLD;
- otherwise **not measured**: the runs' own noise covers the threshold, with the figures.

The measures: the step time (CUDA events on CUDA, else the host's wall clock) and, on CPU, the
timing process's CPU time per step, which other processes' load moves far less than wall time
(they take turns on the cores; the process's own CPU time counts only its turns, and with
passive OpenMP waits none spent spinning). It still moves with load (other work evicts the
process's caches: up to 2.4 times between two runs of the same code on a busy 2-core machine),
which is what the gap-against-spread rule guards against. Either one
slower is a regression; the wall clock too noisy and the CPU time not slower is not slower (a
slowdown from waiting rather than computing is then not seen, and that is said).
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Literal

from traingate.stages.performance.details import PairRatio, SideBySide, SideMeasure
from traingate.stages.performance.spread import quantile, ratio_of_quantiles

THRESHOLD = 0.10  # the relative slowdown that counts as a regression (as for stored timings)
Verdict = Literal["slower", "not slower", "not measured"]
PROCESS_CPU = "process CPU time"
QUANTILE = 0.25  # each run's step time: its lower quartile


@dataclass(frozen=True)
class SideRun:
    """One timing run of either version: its step times after warm-up, by measure."""

    label: str
    baseline: bool
    times: dict[str, list[float]]  # measure -> seconds per step


def judge(commit: str, setting: str, runs: list[SideRun], min_steps: int) -> SideBySide:
    """The side-by-side verdict over `runs`, in the order they ran."""
    measures = [m for m in runs[0].times if all(m in r.times for r in runs)] if runs else []
    short = [r.label for r in runs if min((len(r.times[m]) for m in measures), default=0) < max(min_steps, 2)]
    judged = [] if short else [_measure(name, runs) for name in measures]
    verdict, reason = _overall(judged, short, min_steps)
    first = measures[0] if measures else None
    return SideBySide(
        commit=commit, label=setting, order=[r.label for r in runs], threshold=THRESHOLD, measures=judged, verdict=verdict, reason=reason,
        baseline_step_ms=_median_ms([r for r in runs if r.baseline], first), current_step_ms=_median_ms([r for r in runs if not r.baseline], first),
    )


def _measure(name: str, runs: list[SideRun]) -> SideMeasure:
    pairs: list[PairRatio] = []
    for before, after in zip(runs, runs[1:], strict=False):
        if before.baseline == after.baseline:
            continue
        base, change = (before, after) if before.baseline else (after, before)
        spread = ratio_of_quantiles(change.times[name], base.times[name], QUANTILE)
        if spread is not None:
            pairs.append(PairRatio(runs=[before.label, after.label], spread=spread.record(digits=4)))
    limit = 1 + THRESHOLD
    figures = ", ".join(f"{p.spread.ratio:.2f}x ({p.spread.low:.2f}-{p.spread.high:.2f})" for p in pairs)
    if len(pairs) < 2:
        return SideMeasure(measure=name, pairs=pairs, verdict="not measured", reason="fewer than two adjacent pairs of runs could be compared")
    gap, within = _gap_and_spread(name, runs)
    if all(p.spread.low > limit for p in pairs):
        if gap > within:
            return SideMeasure(measure=name, pairs=pairs, verdict="slower", reason=f"slower beyond {THRESHOLD:.0%} in every adjacent pair of runs ({figures}), by {gap:.2f}x at least, more than the {within:.2f}x between the runs of one version")
        return SideMeasure(
            measure=name, pairs=pairs, verdict="not measured",
            reason=f"slower in every adjacent pair ({figures}), but the runs of one version differ by {within:.2f}x, more than the {gap:.2f}x between the versions: load, not code, can explain it",
        )
    if all(p.spread.high <= limit for p in pairs):
        return SideMeasure(measure=name, pairs=pairs, verdict="not slower", reason=f"no adjacent pair of runs slower beyond {THRESHOLD:.0%}: {figures}")
    return SideMeasure(
        measure=name, pairs=pairs, verdict="not measured",
        reason=f"the runs' own noise covers the {THRESHOLD:.0%} it would judge (ratios of the lower quartiles with their 95 % intervals, pair by pair: {figures})",
    )


def _gap_and_spread(name: str, runs: list[SideRun]) -> tuple[float, float]:
    """(this version's quickest run over the baseline's slowest, the largest ratio between
    two runs of one version), each run by its lower quartile."""
    levels = {side: [quantile(r.times[name], QUANTILE) for r in runs if r.baseline == side and r.times[name]] for side in (True, False)}
    base, change = levels[True], levels[False]
    if not base or not change or min(base) <= 0 or min(change) <= 0:
        return 0.0, float("inf")
    return min(change) / max(base), max(max(base) / min(base), max(change) / min(change))


def _overall(judged: list[SideMeasure], short: list[str], min_steps: int) -> tuple[Verdict, str]:
    if short:
        return "not measured", f"too few steps after warm-up to compare (under {max(min_steps, 2)} in {', '.join(short)})"
    if not judged:
        return "not measured", "no measure was taken by every run"
    slower = [m for m in judged if m.verdict == "slower"]
    if slower:
        return "slower", "; ".join(f"{m.measure}: {m.reason}" for m in slower)
    if all(m.verdict == "not slower" for m in judged):
        return "not slower", "; ".join(f"{m.measure}: {m.reason}" for m in judged)
    steady = [m for m in judged if m.verdict == "not slower" and m.measure == PROCESS_CPU]
    if steady:
        noisy = "; ".join(f"{m.measure}: {m.reason}" for m in judged if m.verdict != "not slower")
        return "not slower", f"{steady[0].measure}: {steady[0].reason}; {noisy} (a slowdown from waiting rather than computing would not be seen)"
    return "not measured", "; ".join(f"{m.measure}: {m.reason}" for m in judged)


def _median_ms(runs: list[SideRun], measure: str | None) -> float | None:
    """The median over the runs of each one's lower quartile, in ms."""
    levels = [quantile(r.times[measure], QUANTILE) for r in runs if measure and r.times.get(measure)]
    return round(median(levels) * 1e3, 4) if levels else None
