"""A metric shown as missed must come with the finding that explains it.

Each thresholded metric of the performance stage belongs to a finding category (by its id's
prefix). A metric marked missed (`passed = False`) with no finding of its category would
tell the reader a threshold failed without saying where or why: the evidence did not carry a
verdict, so the metric is shown as undecided instead, with the reason."""

from __future__ import annotations

from traingate.pipeline.model.schema import Category, Finding, Metric
from traingate.stages.performance.rules import AMP_ACCURACY, AMP_INACTIVE, AMP_MEMORY, AMP_SPEEDUP, HOST_SYNC, INPUT_STALL, MEMORY_LEAK, PERF_REGRESSION

# Metric id prefix -> the categories whose finding explains a miss.
CATEGORIES_BY_PREFIX: dict[str, frozenset[Category]] = {
    "memory.held_growth": frozenset({MEMORY_LEAK}),
    "memory.graph_nodes_growth": frozenset({MEMORY_LEAK}),
    "memory.host_growth": frozenset({MEMORY_LEAK}),
    "memory.peak.": frozenset({PERF_REGRESSION}),
    "data_wait.": frozenset({INPUT_STALL}),
    "syncs.": frozenset({HOST_SYNC}),
    "step_time.": frozenset({PERF_REGRESSION}),
    "amp.": frozenset({AMP_SPEEDUP, AMP_MEMORY, AMP_ACCURACY, AMP_INACTIVE}),
}


def categories_for(metric_id: str) -> frozenset[Category] | None:
    return next((cats for prefix, cats in CATEGORIES_BY_PREFIX.items() if metric_id.startswith(prefix)), None)


def missed_without_finding(metrics: list[Metric], findings: list[Finding]) -> list[Metric]:
    """Metrics marked missed while no finding of their category was raised."""
    raised = {f.category for f in findings}
    return [m for m in metrics if m.passed is False and not ((categories_for(m.id) or frozenset()) & raised)]


def undecided_misses(metrics: list[Metric], findings: list[Finding]) -> list[str]:
    """Shows every metric missed without its finding as undecided (in place, `metrics` keeps
    its order) and returns one line per such metric for the report's "not measured" list."""
    lines = []
    for metric in missed_without_finding(metrics, findings):
        index = metrics.index(metric)
        reason = "the evidence did not decide: no finding of its category was raised"
        metrics[index] = metric.model_copy(update={"passed": None, "note": f"{reason}; {metric.note}" if metric.note else reason})
        lines.append(f"{metric.name}: {reason}.")
    return lines
