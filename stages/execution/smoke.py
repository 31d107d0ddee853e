"""Smoke-call the configured entrypoint in fresh child processes (`entrypoint-crash`, `hang`).

One seeded call with the configured setup and kwargs; with an AMP flag, one call per AMP
setting, the configured one first (the kwargs' value of the flag, else AMP off), on every
device: a crash in the AMP path (`scaler.step()` twice without `update()`) is a crash
whatever the device. A crash in either call is reported; the same crash in both, once.
The two calls depend on nothing of each other, so they run side by side where the cores hold
both besides the stage's other children (`calls_at_once`); nothing times them. One after the
other, a call that overran its budget leaves the next one unrun (it would spend the budget a
second time); side by side, the second's own overrun is then said in a note, not reported twice.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from traingate.stages.execution.details import SmokeRun
from traingate.pipeline.model.findings import SMOKE_CALL_RUN
from traingate.pipeline.model.schema import Category, Finding, Location
from traingate.stages.base import EntrypointRun, StageContext, hang_finding, run_entrypoint
from traingate.stages.contract.messages import ExceptionRecord
from traingate.stages.agent.crash import entrypoint_crash_finding, head
from traingate.stages.common.procstat import usable_cpus
from traingate.stages.execution.coverage import EntrypointSource

_SYNTAX_AT = re.compile(r"\((?P<file>[^()]+), line (?P<line>\d+)\)")


@dataclass
class SmokeResult:
    runs: list[tuple[str, bool | None, EntrypointRun]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def smoke_plan(ctx: StageContext) -> tuple[list[tuple[str, bool | None]], list[str]]:
    """The calls to make, configured setting first, and notes on how the order was chosen."""
    ep = ctx.config.entrypoint
    assert ep is not None
    if not ep.amp_switch:
        return [("smoke", None)], []
    configured = ep.kwargs.get(ep.amp_flag) if ep.amp_flag else None
    first = bool(configured) if isinstance(configured, bool) else False
    order = [first, not first]
    why = f"the configured {ep.amp_flag}={configured!r}" if isinstance(configured, bool) else "AMP off (the kwargs do not set it)"
    return [(f"amp-{'on' if amp else 'off'}", amp) for amp in order], [f"Both AMP settings were called, {why} first."]


def calls_at_once(env: dict[str, str], beside: int) -> int:
    """How many smoke calls may run at once: the cores in this process's affinity mask (what
    the runner gives) hold each call's intra-op threads (`OMP_NUM_THREADS`, torch's default
    being one per core), after the `beside` children the stage runs next to them."""
    cores = usable_cpus()
    first = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    threads = int(first) if first.isdigit() and int(first) > 0 else cores
    return max(1, cores // threads - beside)


def smoke_calls(ctx: StageContext, source: EntrypointSource | None, beside: int = 0) -> SmokeResult:
    """The planned calls, side by side where `calls_at_once` allows, read in the plan's order."""
    result = SmokeResult()
    plan, result.notes = smoke_plan(ctx)
    # The smoke calls are the unwatched run the gate compares the watched ones with: no instrument,
    # and none of the gate's own settings in the environment they start with.
    env = ctx.unwatched_env()
    if len(plan) > 1 and calls_at_once(env, beside) >= len(plan):
        with ThreadPoolExecutor(max_workers=len(plan)) as pool:
            done = list(pool.map(lambda call: run_entrypoint(ctx, label=call[0], amp=call[1], env=env, unwatched=True), plan))
        for (label, amp), run in zip(plan, done, strict=True):
            _read_call(ctx, source, result, label, amp, run)
        return result
    for label, amp in plan:
        if _hung(result):
            result.notes.append(f"The {label} smoke call was not run: the previous call did not finish within its budget.")
            continue
        _read_call(ctx, source, result, label, amp, run_entrypoint(ctx, label=label, amp=amp, env=env, unwatched=True))
    return result


def _hung(result: SmokeResult) -> bool:
    return any(f.category is Category.HANG for f in result.findings)


def _read_call(ctx: StageContext, source: EntrypointSource | None, result: SmokeResult, label: str, amp: bool | None, run: EntrypointRun) -> None:
    """One call's run and what it found: a hang (once: a later call's overrun is a note), a crash."""
    ep = ctx.config.entrypoint
    assert ep is not None
    result.runs.append((label, amp, run))
    what = f"The entrypoint smoke call {ep.label}" + (f" ({ep.amp_setting(amp)})" if amp is not None else "")
    if run.child.timed_out and _hung(result):
        result.notes.append(f"The {label} smoke call, run beside the previous one, did not finish within its budget either.")
    elif run.child.timed_out:
        result.findings.append(ctx.stops_training(hang_finding(ctx, run.child, what, run=SMOKE_CALL_RUN, key=label), "hang"))
    elif not run.ok:
        _add_crash(result, crash_finding(ctx, run, what, source), label)


def _add_crash(result: SmokeResult, finding: Finding, label: str) -> None:
    """The same crash at the same line under both AMP settings is one defect: one finding."""
    same = [f for f in result.findings if f.id == finding.id]
    if same:
        result.notes.append(f"The {label} smoke call crashed the same way ({finding.evidence.summary[:120]}).")
        return
    result.findings.append(finding)


def crash_finding(ctx: StageContext, run: EntrypointRun, what: str, source: EntrypointSource | None) -> Finding:
    """`entrypoint-crash`: the smoke call raised or its process died (see
    `traingate.stages.agent.crash`); a module that does not parse is located from the message, and
    a process that left no trace at all at the entrypoint's `def` line, saying so."""
    fallback = None
    if source is not None:
        fallback = Location(path=source.rel, line=source.first_line, function=None if source.script else source.function)
    return entrypoint_crash_finding(
        ctx, run, what,
        site=_syntax_error_site(run.raised, source) if run.raised else None,
        fallback=fallback,
        fallback_note=" The location is the entrypoint itself: the process left no trace of where it stopped.",
    )


def _syntax_error_site(exc: ExceptionRecord, source: EntrypointSource | None) -> Location | None:
    """A module that does not parse has no frame: its file and line are in the message."""
    if exc.type not in ("SyntaxError", "IndentationError", "TabError") or source is None:
        return None
    match = _SYNTAX_AT.search(exc.message)
    if match and source.file.name == match.group("file").rsplit("/", 1)[-1]:
        return Location(path=source.rel, line=int(match.group("line")))
    return None


def run_details(label: str, amp: bool | None, run: EntrypointRun) -> SmokeRun:
    record = run.record
    returned = record.returned if record is not None else None
    return SmokeRun(
        label=label,
        amp=amp,
        ok=run.ok,
        failure=run.failure(),
        duration_s=round(record.duration_s, 3) if record is not None else None,
        wall_s=round(run.child.duration_s, 3),
        returned=json.dumps(returned, default=str)[:500] if returned is not None else None,
        stdout_head=head(run.child.stdout),
        exit_status=run.child.returncode,
        budget_stop=record.budget.describe() if record is not None and record.budget is not None else None,
    )
