"""The baseline's entrypoint, smoke-called on this version (docs/configuration.md).

Where the change's entrypoint configuration differs from the baseline's (another function or
script, other arguments, a keyword added), the gate hands the baseline's entrypoint to this
stage (`StageContext.baseline_entrypoint`, read from git at the baseline's commit): it is called
once more, on this version's code, with the baseline's setup and arguments, beside the change's
own smoke call. Its crash is an `entrypoint-crash` and its hang a `hang`, as for the change's; a
call that stops at an ImportError, AttributeError, NameError or TypeError at the call itself (no
frame of the target's code: the function or a keyword was renamed) is the medium
`verification-narrowed/interface-changed`. Nothing runs where the configurations agree.
"""

from __future__ import annotations

from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import EntrypointRun, StageContext, hang_finding, run_entrypoint
from traingate.pipeline.model.text import clip_line
from traingate.stages.agent.crash import entrypoint_crash_finding
from traingate.stages.execution.coverage import entrypoint_source
from traingate.stages.execution.smoke import SmokeResult

LABEL = "baseline-smoke"
INTERFACE_RULE = "verification-narrowed/interface-changed"
# Exceptions that, raised at the call with no frame of the target's, say its interface changed.
INTERFACE_ERRORS = frozenset({"TypeError", "ImportError", "ModuleNotFoundError", "AttributeError", "NameError"})


def baseline_smoke(ctx: StageContext) -> SmokeResult | None:
    """One seeded call of the baseline's entrypoint (its configured AMP setting); None: none to make."""
    ep = ctx.baseline_entrypoint
    if ep is None:
        return None
    if ep.script is not None and not (ctx.root / ep.script).is_file():
        # Nothing to call: the script was renamed or removed (a script run would only fail to open it).
        return SmokeResult(findings=[_interface_changed(ctx, f"its script {ep.script} is not in this version", None)], notes=[f"The baseline's script {ep.script} is not in this version: not called."])
    configured = ep.kwargs.get(ep.amp_flag) if ep.amp_flag else None
    amp = (configured if isinstance(configured, bool) else False) if ep.amp_switch else None
    run = run_entrypoint(ctx, label=LABEL, amp=amp, env=ctx.child_env(), entrypoint=ep)
    result = SmokeResult(runs=[(LABEL, amp, run)])
    commit = ctx.baseline.target.commit if ctx.baseline is not None else None
    what = f"The baseline's entrypoint {ep.label} (commit {(commit or '?')[:12]}), smoke-called on this version"
    if run.child.timed_out:
        result.findings.append(hang_finding(ctx, run.child, what, run=LABEL, key=LABEL))
    elif not run.ok:
        exc = run.raised
        if exc is not None and interface_change(run):
            result.findings.append(_interface_changed(ctx, f"{exc.type}: {exc.message}", exc.traceback))
        else:
            result.findings.append(_crash(ctx, run, what))
    return result


def interface_change(run: EntrypointRun) -> bool:
    exc = run.raised
    return exc is not None and exc.type in INTERFACE_ERRORS and exc.target_frame is None


def _crash(ctx: StageContext, run: EntrypointRun, what: str) -> Finding:
    ep = ctx.baseline_entrypoint
    assert ep is not None
    source = entrypoint_source(ctx.root, ep)
    fallback = Location(path=source.rel, line=source.first_line, function=None if source.script else source.function) if source is not None else None
    return entrypoint_crash_finding(ctx, run, what, fallback=fallback, stops_training=False)


def _interface_changed(ctx: StageContext, error: str, traceback: str | None) -> Finding:
    ep = ctx.baseline_entrypoint
    assert ep is not None
    error = clip_line(error, 300)
    what = f"The baseline's entrypoint {ep.label}"
    return ctx.finding(
        category=Category.VERIFICATION_NARROWED, rule=INTERFACE_RULE, key=LABEL, location=None,
        severity=Severity.HIGH if ctx.config.policy.interface_changes_block else Severity.MEDIUM,
        title=clip_line(f"{what} no longer runs on this version ({error}); the change's own entrypoint ran", 300),
        problem=f"{what}, smoke-called on this version, stopped at {error} before any of the target's code ran: the entrypoint or its keywords were renamed with the configuration. Whether the renamed code behaves as the baseline's did is verified only by the change's own configuration.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=error, traceback=(traceback or "")[-8000:] or None, data={"entrypoint": ep.model_dump(mode="json"), "error": error}),
    )
