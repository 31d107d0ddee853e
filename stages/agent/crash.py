"""`entrypoint-crash` from any stage: the target's own code raised or died in one of its runs.

Every stage calls the entrypoint; when the target's code crashes there, the fix is in the
target, so the finding is an `entrypoint-crash` at the target's line (with the run named in
its title), not a `stage-error`, which stays for failures of the gate itself. A call that
failed only because a package the target imports is not installed here is an `environment`
finding instead (`traingate.stages.agent.environment`).
"""

from __future__ import annotations

import linecache
from traingate.stages.common.stacks import crash_frames
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import EntrypointRun, StageContext, innermost_target_frame, location_of
from traingate.stages.agent.environment import ENTRYPOINT_RUN, environment_finding, missing_module
from traingate.stages.shared_categories import ENTRYPOINT_CRASH

_STDOUT_LINES = 20
_PHASES = {"import": "importing its module", "setup": "running its setup"}


def is_target_crash(ctx: StageContext, run: EntrypointRun) -> bool:
    """The run failed in the target's own code: it raised with a frame of the target on the
    stack (or while importing or setting up the target), or its process died inside the target."""
    if run.ok or run.child.timed_out or run.channel_problem:
        return False
    record = run.record
    if record is not None and record.exception is not None:
        if record.exception.raised_in_gate:
            return False  # the gate's instrument raised inside the target's call: the gate's failure
        return record.exception.target_frame is not None or record.phase in _PHASES
    return innermost_target_frame(crash_frames(run.child.stacks), ctx.root) is not None


def entrypoint_crash_finding(
    ctx: StageContext,
    run: EntrypointRun,
    what: str,
    *,
    fallback: Location | None = None,
    fallback_note: str = "",
    site: Location | None = None,
    stops_training: bool = True,
) -> Finding:
    """`entrypoint-crash` for `run`, described as `what` ("The entrypoint smoke call f (use_amp=True)"),
    noted as leaving later stages nothing to run (see `_crash_finding`) unless `stops_training`
    is false (a run of another configuration than the one the later stages run)."""
    found = _crash_finding(ctx, run, what, fallback=fallback, fallback_note=fallback_note, site=site)
    return found if found.category is Category.ENVIRONMENT or not stops_training else ctx.stops_training(found, "crash")


def _crash_finding(
    ctx: StageContext,
    run: EntrypointRun,
    what: str,
    *,
    fallback: Location | None,
    fallback_note: str,
    site: Location | None,
) -> Finding:
    """`entrypoint-crash` for `run`.

    Located at the innermost frame of the target's code: from the exception's traceback, or
    from the stack the guard dumped when the process killed itself; else at `site` (a place
    the caller read from the message, e.g. a SyntaxError's), else at `fallback` with
    `fallback_note` said in the problem. A missing package is the environment's: `environment`.
    """
    record = run.record
    exc = record.exception if record is not None else None
    if (missing := missing_module(ctx.root, exc)) is not None and exc is not None:
        return environment_finding(ctx, exc, missing, what, location_of(exc.target_frame) or site or fallback, run=ENTRYPOINT_RUN)
    no_trace = ""
    failure = run.failure() or "ended before reporting"
    if record is not None and exc is not None:
        frame = exc.target_frame
        location = location_of(frame) or site
        code = frame.code if frame is not None else ""
        traceback: str | None = exc.traceback
        phase = record.phase
    else:
        frames = crash_frames(run.child.stacks)
        location = innermost_target_frame(frames, ctx.root)
        code = line_text(ctx, location)
        traceback = run.child.stacks[-20000:] if frames else None
        phase = "call"
    if location is None and fallback is not None:
        location = fallback
        no_trace = fallback_note
    where = f" at {location.path}:{location.line}" if location and location.line else ""
    return ctx.finding(
        category=ENTRYPOINT_CRASH,
        title=f"{what} {failure.split(':')[0]}{where}",
        location=location,
        problem=f"{what} {failure}{' while ' + _PHASES[phase] if phase != 'call' else ''}{(': `' + code + '`') if code else ''}.{no_trace}",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=failure[:300],
            traceback=traceback or _tail(run.child.stderr) or None,
            data={"exit_status": run.child.returncode, "signal": run.child.signal_name, "phase": phase, "code": code, "stdout_head": head(run.child.stdout)},
        ),
        key=f"{ending(run)}\x1f{code}",
    )


def ending(run: EntrypointRun) -> str:
    """How the call ended, as data: the exception type, the signal, or the exit status."""
    if run.raised:
        return run.raised.type
    return run.child.signal_name or f"exit-status-{run.child.returncode}"


def line_text(ctx: StageContext, location: Location | None) -> str:
    if location is None or not location.line:
        return ""
    return linecache.getline(str(ctx.root / location.path), location.line).strip()


def head(text: str) -> str:
    return "\n".join(text.splitlines()[:_STDOUT_LINES])


def _tail(text: str) -> str:
    return text[-6000:].strip()
