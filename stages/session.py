"""The part of a stage run that every stage observing the entrypoint shares: the child runs it
made (as its report lists them), its findings, why it stopped early, and how it fails closed
when a run it depends on went wrong. The concurrency and correctness stages each subclass it
with their own checks."""

from __future__ import annotations

from typing import Any

from traingate.pipeline.schema import Evidence, EvidenceKind, Finding
from traingate.stages.base import EntrypointRun, StageContext, entrypoint_fallback, hang_finding, location_of


class StageSession:
    """One stage run over the configured entrypoint."""

    stage = ""  # the stage's name, as findings and run titles say it

    def __init__(self, ctx: StageContext) -> None:
        assert ctx.config.entrypoint is not None
        self.ctx = ctx
        self.entrypoint = ctx.config.entrypoint
        self.fallback = entrypoint_fallback(ctx)
        self.findings: list[Finding] = []
        self.runs: list[dict[str, Any]] = []
        self.checks: dict[str, Any] = {}
        self.stopped: str | None = None

    def _record_run(self, run: EntrypointRun, label: str, purpose: str, settings: dict[str, Any], observed: dict[str, Any] | None = None) -> EntrypointRun | None:
        """Lists a finished child run (its `settings` before its duration and outcome, what it
        `observed` after); None, with a `hang` finding, when it overran its budget."""
        outcome = "returned" if run.ok else (run.failure() or "failed")
        self.runs.append({"label": label, "purpose": purpose, **settings, "duration_s": round(run.child.duration_s, 2), "outcome": outcome, **(observed or {})})
        if run.child.timed_out:
            self.findings.append(hang_finding(self.ctx, run.child, f"The {self.stage} stage's {label} run", run=label))
            self.stopped = f"the {label} run did not finish within its budget"
            return None
        return run

    def _fail(self, run: EntrypointRun, what: str, *, reason: str, key: str = "", detail: str | None = None, observed_nothing: bool = False) -> None:
        """A blocking `stage-error`: a run the checks depend on failed. `reason` (and `key`)
        identify the failure in the fingerprint; `what` is for readers."""
        exc = run.exception or {}
        self.findings.append(
            self.ctx.stage_error(
                what,
                reason=reason,
                key=key,
                title=f"The {self.stage} stage could not observe the training: {what}",
                location=location_of(exc.get("target_frame")) or self.fallback,
                problem=f"{what}: there was no training loop to observe, so no check could run." if observed_nothing else f"{what} ({run.failure() or 'returned'}); the checks that depend on it did not run.",
                impact="Nothing this stage would have checked can be vouched for, so the gate blocks (fail closed).",
                fix="Point [tool.traingate.entrypoint] at a function that trains for a few steps." if observed_nothing else "Run the execution stage for the entrypoint's own failure; if the failure only happens here, report it with this report.json.",
                evidence=Evidence(
                    kind=EvidenceKind.OBSERVED,
                    summary=run.failure() or what,
                    traceback=detail or exc.get("traceback") or (run.child.stderr[-8000:] or None),
                    data={"returncode": run.child.returncode},
                ),
            )
        )
