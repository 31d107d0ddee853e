"""The part of a stage run that every stage observing the entrypoint shares: the child runs it
made (as its report lists them), its findings, why it stopped early, and how it fails closed
when a run it depends on went wrong. The concurrency and correctness stages each subclass it
with their own checks and their own record of a run."""

from __future__ import annotations

from typing import Generic, Protocol, TypeVar

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding
from traingate.stages.base import EntrypointRun, StageContext, entrypoint_fallback, location_of
from traingate.pipeline.model.findings import stopped_finding


class RunRecord(Protocol):
    """What the session reads of a stage's record of one child run."""

    @property
    def label(self) -> str: ...
    @property
    def duration_s(self) -> float: ...


RunT = TypeVar("RunT", bound=RunRecord)


def run_outcome(run: EntrypointRun) -> str:
    """How a child run ended, in a few words, for the stage's list of runs."""
    return "returned" if run.ok else (run.failure() or "failed")


class StageSession(Generic[RunT]):
    """One stage run over the configured entrypoint; `RunT` is the stage's record of a run."""

    stage = ""  # the stage's name, as findings and run titles say it

    def __init__(self, ctx: StageContext) -> None:
        assert ctx.config.entrypoint is not None
        self.ctx = ctx
        self.entrypoint = ctx.config.entrypoint
        self.fallback = entrypoint_fallback(ctx)
        self.findings: list[Finding] = []
        self.runs: list[RunT] = []
        self.stopped: str | None = None

    def _record_run(self, run: EntrypointRun, record: RunT) -> EntrypointRun | None:
        """Lists a finished child run (`record`, built with `run_outcome`); None, with a `hang`
        finding, when it overran its budget."""
        self.runs.append(record)
        if run.child.timed_out:
            label = record.label
            self.findings.append(stopped_finding(self.ctx, run.child, f"The {self.stage} stage's {label} run", run=label, progress=run.progress))
            self.stopped = f"the {label} run did not finish within its budget"
            return None
        return run

    def _runs_wall_s(self) -> float:
        return round(sum(r.duration_s for r in self.runs), 2)

    def _fail(self, run: EntrypointRun, what: str, *, reason: str, key: str = "", detail: str | None = None, observed_nothing: bool = False) -> None:
        """A blocking `stage-error`: a run the checks depend on failed. `reason` (and `key`)
        identify the failure in the fingerprint; `what` is for readers."""
        exc = run.raised
        self.findings.append(
            self.ctx.stage_error(
                what,
                reason=reason,
                key=key,
                title=f"The {self.stage} stage could not observe the training: {what}",
                location=location_of(exc.target_frame if exc is not None else None) or self.fallback,
                problem=f"{what}: there was no training loop to observe, so no check could run." if observed_nothing else f"{what} ({run.failure() or 'returned'}); the checks that depend on it did not run.",
                impact="Nothing this stage would have checked can be vouched for, so the gate blocks (fail closed).",
                fix="Point [tool.traingate.entrypoint] at a function that trains for a few steps." if observed_nothing else "Run the execution stage for the entrypoint's own failure; if the failure only happens here, report it with this report.json.",
                evidence=Evidence(
                    kind=EvidenceKind.OBSERVED,
                    summary=run.failure() or what,
                    traceback=detail or (exc.traceback if exc is not None else None) or (run.child.stderr[-8000:] or None),
                    data={"returncode": run.child.returncode},
                ),
            )
        )
