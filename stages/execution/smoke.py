"""Smoke-call the configured entrypoint in fresh child processes (`entrypoint-crash`, `hang`).

One seeded call with the configured setup and kwargs; with an AMP flag, once with AMP off
and, on CUDA only, once with AMP on (on a CPU the AMP-on path is not the one users run, so
the call is left out and the details say so).
"""

from __future__ import annotations

import json
import linecache
import re
from dataclasses import dataclass, field
from typing import Any

from traingate.pipeline.findings import SMOKE_CALL_RUN
from traingate.pipeline.isolation import crash_frames
from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import EntrypointRun, StageContext, hang_finding, innermost_target_frame, location_of, run_entrypoint
from traingate.stages.execution.coverage import EntrypointSource

_STDOUT_LINES = 20
_SYNTAX_AT = re.compile(r"\((?P<file>[^()]+), line (?P<line>\d+)\)")


@dataclass
class SmokeResult:
    runs: list[tuple[str, bool | None, EntrypointRun]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def details(self) -> dict[str, Any]:
        return {"runs": [run_details(label, amp, run) for label, amp, run in self.runs], "notes": self.notes}


def smoke_plan(ctx: StageContext) -> tuple[list[tuple[str, bool | None]], list[str]]:
    """The calls to make, and why any AMP setting is left out."""
    ep = ctx.config.entrypoint
    assert ep is not None
    if not ep.amp_switch:
        return [("smoke", None)], []
    plan: list[tuple[str, bool | None]] = [("amp-off", False)]
    if ctx.device == "cuda":
        return plan + [("amp-on", True)], []
    return plan, [f"The AMP-on smoke call ({ep.amp_setting(True)}) was not run: the device is {ctx.device}, and mixed precision is only exercised as users run it on CUDA."]


def smoke_calls(ctx: StageContext, source: EntrypointSource | None) -> SmokeResult:
    result = SmokeResult()
    plan, result.notes = smoke_plan(ctx)
    ep = ctx.config.entrypoint
    assert ep is not None
    env = ctx.child_env(PYTHONDONTWRITEBYTECODE="1")
    for label, amp in plan:
        if result.findings:
            result.notes.append(f"The {label} smoke call was not run: the previous call already failed.")
            continue
        run = run_entrypoint(ctx, label=label, amp=amp, env=env)
        result.runs.append((label, amp, run))
        what = f"The entrypoint smoke call {ep.label}" + (f" ({ep.amp_setting(amp)})" if amp is not None else "")
        if run.child.timed_out:
            result.findings.append(hang_finding(ctx, run.child, what, run=SMOKE_CALL_RUN, key=label))
        elif not run.ok:
            result.findings.append(crash_finding(ctx, run, what, source))
    return result


def crash_finding(ctx: StageContext, run: EntrypointRun, what: str, source: EntrypointSource | None) -> Finding:
    """`entrypoint-crash`: the smoke call raised or its process died.

    Located at the innermost frame of the target's code: from the exception's traceback,
    or from the stack the guard dumped when the process killed itself; when the process
    left no trace at all, at the entrypoint's `def` line, and the finding says so.
    """
    exc = run.exception
    no_trace = ""
    failure = run.failure() or "ended before reporting"
    if exc is not None:
        frame = exc.get("target_frame")
        location = location_of(frame) or _syntax_error_site(exc, source)
        code = (frame or {}).get("code", "")
        traceback = exc.get("traceback")
        phase = (run.result or {}).get("phase", "call")
    else:
        frames = crash_frames(run.child.stacks)
        location = innermost_target_frame(frames, ctx.root)
        code = _line_text(ctx, location)
        traceback = run.child.stacks[-20000:] if frames else None
        phase = "call"
    if location is None and source is not None:
        location = Location(path=source.rel, line=source.first_line, function=None if source.script else source.function)
        no_trace = " The location is the entrypoint itself: the process left no trace of where it stopped."
    where = f" at {location.path}:{location.line}" if location and location.line else ""
    return ctx.finding(
        category=Category.ENTRYPOINT_CRASH,
        severity=Severity.CRITICAL,
        title=f"{what} {failure.split(':')[0]}{where}",
        location=location,
        problem=f"{what} {failure}{' while ' + _PHASES.get(phase, phase) if phase != 'call' else ''}{(': `' + code + '`') if code else ''}.{no_trace}",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=failure[:300],
            traceback=traceback or _tail(run.child.stderr) or None,
            data={"exit_status": run.child.returncode, "signal": run.child.signal_name, "phase": phase, "code": code, "stdout_head": _head(run.child.stdout)},
        ),
        key=f"{_ending(run)}\x1f{code}",
    )


_PHASES = {"import": "importing its module", "setup": "running its setup"}


def _ending(run: EntrypointRun) -> str:
    """How the call ended, as data: the exception type, the signal, or the exit status."""
    if run.exception:
        return str(run.exception.get("type"))
    return run.child.signal_name or f"exit-status-{run.child.returncode}"


def _syntax_error_site(exc: dict[str, Any], source: EntrypointSource | None) -> Location | None:
    """A module that does not parse has no frame: its file and line are in the message."""
    if exc.get("type") not in ("SyntaxError", "IndentationError", "TabError") or source is None:
        return None
    match = _SYNTAX_AT.search(exc.get("message", ""))
    if match and source.file.name == match.group("file").rsplit("/", 1)[-1]:
        return Location(path=source.rel, line=int(match.group("line")))
    return None


def _line_text(ctx: StageContext, location: Location | None) -> str:
    if location is None or not location.line:
        return ""
    return linecache.getline(str(ctx.root / location.path), location.line).strip()


def run_details(label: str, amp: bool | None, run: EntrypointRun) -> dict[str, Any]:
    result = run.result or {}
    returned = result.get("returned")
    return {
        "label": label,
        "amp": amp,
        "ok": run.ok,
        "failure": run.failure(),
        "duration_s": round(float(result["duration_s"]), 3) if "duration_s" in result else None,
        "wall_s": round(run.child.duration_s, 3),
        "returned": json.dumps(returned, default=str)[:500] if returned is not None else None,
        "stdout_head": _head(run.child.stdout),
        "exit_status": run.child.returncode,
    }


def _head(text: str) -> str:
    return "\n".join(text.splitlines()[:_STDOUT_LINES])


def _tail(text: str) -> str:
    return text[-6000:].strip()
