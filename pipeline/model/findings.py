"""Builders of findings shared by the gate and the stages.

`finding` builds a finding from its rule (`traingate.pipeline.model.rules`): the rule's id, its
default severity, when it blocks, and its generic impact and fix; `stage_error` and `hang`
(`hang_finding` for one child run) build the two findings the gate itself produces, the same
way wherever they arise. A stage builds its findings with `StageContext.finding`, which calls
`finding`; `Finding.create`, underneath, is called from here only. Fingerprint keys are data
(a reason code, a run name), never the prose shown to readers.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from traingate.pipeline.supervision.isolation import ChildResult
from traingate.stages.common.stacks import Frame
from traingate.pipeline.model.registry import rule_table
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.common.frames import is_target_file, relative

# `evidence.data["run"]` of a hang in the entrypoint's smoke call (its fingerprint key too).
SMOKE_CALL_RUN = "smoke-call"
_TRACEBACK_TAIL = 8000
_STACKS_TAIL = 20000


def finding(
    *,
    stage: str,
    category: Category,
    title: str,
    location: Location | None,
    problem: str,
    evidence: Evidence,
    block_on: Iterable[Severity],
    severity: Severity | None = None,
    impact: str | None = None,
    fix: str | None = None,
    key: str = "",
    rule: str | None = None,
) -> Finding:
    """A complete finding built from its rule: `rule` (a sub-rule's id) or the category's own.
    Severity, impact and fix default to the rule's; a finding states its own severity only where
    its evidence makes it graver or milder than the rule's default."""
    found = rule_table().rule(category, rule)
    return Finding.create(
        stage=stage,
        category=category,
        severity=severity if severity is not None else found.severity,
        title=title,
        location=location,
        problem=problem,
        impact=impact if impact is not None else found.impact,
        fix=fix if fix is not None else found.fix,
        evidence=evidence,
        block_on=set(block_on),
        key=key,
        rule=found.id,
        blocks=found.blocks,
    )


def locations_data(places: Iterable[Location]) -> list[dict[str, Any]]:
    """Places as evidence data holds them (`traingate.pipeline.model.schema.LOCATIONS_KEY`, read by `Finding.every_location`)."""
    return [place.model_dump(mode="json") for place in places]


def stage_error(
    stage: str,
    what: str,
    *,
    reason: str,
    block_on: Iterable[Severity],
    child: ChildResult | None = None,
    detail: str = "",
    title: str | None = None,
    problem: str | None = None,
    impact: str | None = None,
    fix: str | None = None,
    location: Location | None = None,
    evidence: Evidence | None = None,
    data: dict[str, Any] | None = None,
    key: str = "",
) -> Finding:
    """`stage-error`: the stage could not do its job; the gate fails closed.

    `what` says in a few words what went wrong; `reason` is a stable code for it (the
    fingerprint key, with `key` when one reason has several cases, and `evidence.data["reason"]`),
    so rewording `what` keeps the id.
    Without an explicit `evidence`, it is built from `child`: its exit and the tail of
    `detail` or its stderr.
    """
    if evidence is None:
        evidence = _child_evidence(child, detail, summary=what)
    evidence = evidence.model_copy(update={"data": {**evidence.data, **(data or {}), "reason": reason}})
    exit_desc = f" ({_exit_description(child)})" if child is not None and problem is None else ""
    return finding(
        stage=stage,
        category=Category.STAGE_ERROR,
        title=title or f"The {stage} stage failed: {what}",
        location=location,
        problem=problem or f"{what}{exit_desc}; nothing it would have checked can be trusted.",
        impact=impact,
        fix=fix,
        evidence=evidence,
        block_on=block_on,
        key=f"{reason}\x1f{key}" if key else reason,
    )


class FindingScope(Protocol):
    """Where a finding is made: the stage, the target's root and the severities that block."""

    @property
    def stage(self) -> str: ...
    @property
    def root(self) -> Path: ...
    @property
    def block_on(self) -> set[Severity]: ...


def hang(
    scope: FindingScope,
    what: str,
    *,
    run: str,
    location: Location | None,
    problem: str,
    summary: str,
    stacks: str,
    data: dict[str, Any],
    key: str = "",
    title: str | None = None,
    severity: Severity | None = None,
    fix: str | None = None,
) -> Finding:
    """`hang`: a run overran its budget; the stacks of every thread are the evidence.

    `run` names the run that hung (`smoke-call`, `pytest`, `stage-agent`, `distributed`, ...):
    it goes into `evidence.data["run"]` for the gate to act on and, with `key`, into the fingerprint.
    """
    return finding(
        stage=scope.stage,
        category=Category.HANG,
        severity=severity,
        title=title or f"{what} did not finish within its budget",
        location=location,
        problem=problem,
        fix=fix,
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=summary, traceback=stacks or None, data={"run": run, **data}),
        block_on=scope.block_on,
        key=f"{run}\x1f{key}" if key else run,
    )


def budget_overrun(scope: FindingScope, what: str, *, run: str, problem: str, summary: str, stacks: str, data: dict[str, Any], fix: str, key: str = "") -> Finding:
    """`budget-overrun`: a run still making progress when its budget ran out (not a hang: it
    had not stopped). Fails closed as a hang does; the first line says which it was."""
    return finding(
        stage=scope.stage,
        category=Category.BUDGET_OVERRUN,
        title=f"{what} was still making progress when its budget ran out",
        location=None,
        problem=problem,
        fix=fix,
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=summary, traceback=stacks[-_STACKS_TAIL:] or None, data={"run": run, **data}),
        block_on=scope.block_on,
        key=f"{run}\x1f{key}" if key else run,
    )


def hang_finding(scope: FindingScope, child: ChildResult, what: str, *, run: str, key: str = "") -> Finding:
    """`hang` of one child run, located where its main thread waits in the target's code."""
    frames = child.main_thread_frames()
    waiting = frames[0] if frames else None
    return hang(
        scope,
        what,
        run=run,
        key=key,
        location=target_location(frames, scope.root),
        problem=(
            f"{what} was still running after {child.duration_s:.1f}s"
            + (f"; the main thread waits in {waiting.function} ({Path(waiting.path).name}:{waiting.line})" if waiting else "")
            + "."
        ),
        summary=f"killed after {child.duration_s:.1f}s; {len(child.processes)} process(es) in its group",
        stacks=child.stacks[-_STACKS_TAIL:],
        data={"processes": child.processes, "budget_exceeded_s": round(child.duration_s, 2)},
    )


# A run stopped at its budget was still making progress when its last step (or, for a suite,
# the test it was running) started less than this share of the run, or this many seconds, before.
PROGRESS_SHARE = 0.25
PROGRESS_S = 5.0


def progressing(idle_s: float, duration_s: float) -> bool:
    """A run stopped at its budget was still making progress: its last sign of it (a step, a
    finished test) came within PROGRESS_S, or PROGRESS_SHARE of the run, of its end."""
    return idle_s <= max(PROGRESS_S, PROGRESS_SHARE * duration_s)


RUN_FIX = "Make the run short: `max_steps` or `max_batches` in [entrypoint] (the step budget), or smaller epochs or data in its arguments; or raise `timeout_s`."


def stopped_finding(scope: FindingScope, child: ChildResult, what: str, *, run: str, key: str = "", progress: tuple[int, float] | None = None, fix: str = RUN_FIX) -> Finding:
    """A run killed at its budget: `budget-overrun` where it was still making optimizer steps
    (`progress`: the steps it made, and the seconds from its last one to its end), else `hang`."""
    if progress is None or not progressing(progress[1], child.duration_s):
        return hang_finding(scope, child, what, run=run, key=key)
    steps, idle = progress
    return budget_overrun(
        scope, what, run=run, key=key,
        problem=(
            f"{what} made {steps} optimizer step(s) in {child.duration_s:.0f}s and was still stepping when its budget ended "
            f"(its last step {idle:.1f}s before): it had not stopped, it had not finished. What it had not reached was not verified."
        ),
        summary=f"{steps} optimizer step(s), the last {idle:.1f}s before it was stopped at {child.duration_s:.0f}s",
        stacks=child.stacks, data={"optimizer_steps": steps, "last_step_s_before_end": round(idle, 2), "budget_exceeded_s": round(child.duration_s, 2)},
        fix=fix,
    )


def target_location(frames: list[Frame], root: Path) -> Location | None:
    """Location of the innermost frame (frames innermost first) in the target's own code."""
    for frame in frames:
        if is_target_file(frame.path, root):
            return Location(path=relative(frame.path, root), line=frame.line, function=frame.function)
    return None


def _exit_description(child: ChildResult | None) -> str:
    if child is None:
        return ""
    return child.signal_name or f"exit status {child.returncode}"


def _child_evidence(child: ChildResult | None, detail: str, summary: str) -> Evidence:
    if child is None:
        return Evidence(kind=EvidenceKind.OBSERVED, summary=summary, traceback=detail[-_TRACEBACK_TAIL:] or None)
    tail = detail or (child.stderr[-_TRACEBACK_TAIL:] if child.stderr else "")
    return Evidence(
        kind=EvidenceKind.OBSERVED,
        summary=_exit_description(child),
        traceback=tail or None,
        data={"returncode": child.returncode},
    )
