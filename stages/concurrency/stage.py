"""The concurrency stage: observe the training, rerun it, and report only what was seen.

Runs (each a child process with the stage's remaining budget; past it, `hang`):
1. the instrumented run: GradScaler/optimizer calls, DataLoader constructions, workers and
   start methods, seeding calls, and on CUDA the non_blocking and stream-race watches. Its
   instruments do not change numerics, so it is also the first determinism run;
2. a rerun with another PYTHONHASHSEED, recording only the loss per optimizer step;
3. only after a divergence: a rerun with the first run's PYTHONHASHSEED (hash order or an
   unseeded source?), and when no seeding call explains it, a rerun with
   torch.use_deterministic_algorithms(True) to name the op.
A finding exists only when a wrong order was observed, two runs diverged, or a worker failed;
the non_blocking check on a CPU, where a copy cannot race, reads the source and never blocks.
"""

from __future__ import annotations
from typing import Any

from traingate.stages.concurrency.config import ConcurrencyConfig
from traingate.stages.concurrency.probe.payloads import CONCURRENCY_LOADERS as LOADERS, CONCURRENCY_LOSSES as LOSSES, CONCURRENCY_NONBLOCKING as NONBLOCKING, CONCURRENCY_RNG as RNG, CONCURRENCY_STREAMS as STREAMS, CONCURRENCY_TRACE as TRACE
from traingate.stages.concurrency.details import (
    CheckNote,
    ConcurrencyChecks,
    ConcurrencyDetails,
    ConcurrencyRun,
    DeterminismDetails,
    LoaderDetails,
    ProtocolDetails,
)
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Metric, StageOutcome
from traingate.stages.base import EntrypointRun, StageContext, location_of, no_entrypoint_outcome, run_entrypoint, start_warm_early, with_leftover_findings
from traingate.stages.agent.session import StageSession, run_outcome
from traingate.stages.agent.crash import entrypoint_crash_finding, is_target_crash
from traingate.stages.agent.checks import Check, Checked, run_checks
from traingate.stages.concurrency.checks import DataLoaderHazards, GradScalerProtocol, InstrumentedRun, NonBlockingCopies, StreamRaces
from traingate.pipeline.model.returned import comparable_leaves
from traingate.stages.concurrency.determinism import (
    Divergence,
    NondeterminismData,
    RunData,
    compare,
    deterministic_op,
    nondeterminism_finding,
    returned_only_finding,
    rng_causes,
    side_by_side,
)
from traingate.stages.concurrency.static import set_iterations
from traingate.stages.concurrency.probe.payloads import (
    MODELS,
    LossTracePayload,
    ProtocolTracePayload,
    RngPayload,
)
from traingate.stages.concurrency.rules import DATALOADER_HAZARD, GRADSCALER_PROTOCOL, NONBLOCKING_RACE, STREAM_RACE

FIRST_HASH_SEED = "0"
_SCALER_ERRORS = ("unscale_()", "step() has already been called", "No inf checks were recorded")


class ConcurrencyWork:
    """The stage's work, run in its agent (`traingate.stages.concurrency.spec.ConcurrencyStage` is what the gate registers)."""

    def run(self, ctx: StageContext) -> StageOutcome:
        if ctx.config.entrypoint is None:
            return no_entrypoint_outcome("the concurrency checks observe and rerun the training function")
        return with_leftover_findings(ctx, _Session(ctx).run())


class _Session(StageSession[ConcurrencyRun]):
    """One stage run: its child runs, findings and the details its report renders."""

    stage = "concurrency"

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.cuda = ctx.device == "cuda"
        self.records: dict[str, Any] = {}  # each check's record for the report, by its name; absent: not reached
        self.first: EntrypointRun | None = None  # the instrumented run, once its checks have read it

    # -- child runs --------------------------------------------------------------------------------
    def _run(self, label: str, purpose: str, instruments: list[str], hash_seed: str, deterministic: bool = False) -> EntrypointRun | None:
        """One child run; None (with a `hang` finding) when it overran its budget."""
        options = {
            "concurrency": {
                "start_methods": list(self.ctx.section(ConcurrencyConfig).dataloader_start_methods),
                "probe_timeout_s": max(5.0, min(60.0, self.ctx.child_budget() / 4)),
            }
        }
        run = run_entrypoint(
            self.ctx,
            label=label,
            amp=True if self.entrypoint.amp_switch else None,
            instruments=instruments,
            options=options,
            deterministic=deterministic,
            env=self.ctx.child_env(PYTHONHASHSEED=hash_seed),
        )
        recorded = _recorded(run)
        steps = len(recorded.losses) if recorded is not None else 0
        record = ConcurrencyRun(
            label=label, purpose=purpose, hash_seed=hash_seed, deterministic=deterministic,
            duration_s=round(run.child.duration_s, 2), outcome=run_outcome(run), steps=steps,
        )
        return self._record_run(run, record)

    def _budget_allows(self, reference: EntrypointRun) -> bool:
        return self.ctx.child_budget() >= reference.child.duration_s * 1.2 + 2.0

    # -- the stage ----------------------------------------------------------------------------------
    def run(self) -> StageOutcome:
        instruments = [TRACE, RNG, LOADERS] + ([NONBLOCKING, STREAMS] if self.cuda else [])
        # The rerun's hash seed needs an interpreter of its own (it is fixed at start-up): its
        # torch import overlaps the instrumented run instead of following it.
        start_warm_early(self.ctx, self.ctx.child_env(PYTHONHASHSEED=_rerun_hash_seed(1)))
        first = self._run("instrumented", "GradScaler protocol, DataLoaders, seeding calls; determinism run 1", instruments, FIRST_HASH_SEED)
        if first is None:
            return self._outcome(None)
        if first.result is None:
            if is_target_crash(self.ctx, first):
                self._crash_or_fail(first)
            else:
                self._fail(first, "the instrumented run ended without reporting", reason="no-result")
            return self._outcome(first)
        # An instrument whose collect() raised hands back its traceback instead of a payload
        # (`error`); one that handed back nothing fails the same way.
        broken = [spec for spec in instruments if first.payload(spec, MODELS[spec]) is None]
        if broken:
            self._fail(first, f"instrument {broken[0]} failed", reason="instrument-failed", key=broken[0], detail=first.instrument_error(broken[0]))
            return self._outcome(first)
        self.records.update(run_checks(CHECKS, InstrumentedRun(self.ctx, first, self.fallback), self.findings))
        protocol, trace = self.records[GradScalerProtocol.name], first.payload(TRACE, ProtocolTracePayload)
        if first.ok and protocol.steps == 0 and trace is not None and not trace.steps:
            self._fail(first, "the instrumented run returned without a single optimizer step", reason="no-optimizer-step", observed_nothing=True)
        if self._unexplained_failure(first):
            self.stopped = "the instrumented run failed for a reason none of this stage's checks explains"
            return self._outcome(first)
        self.first = first
        self.records.update(run_checks(OWN_RUN_CHECKS, self, self.findings))
        return self._outcome(first)


    def _unexplained_failure(self, first: EntrypointRun) -> bool:
        """The instrumented run failed and no finding of this stage explains why (then the
        stage fails closed and skips the reruns, which would fail the same way)."""
        if first.ok:
            return False
        exc = first.raised
        message = exc.message if exc is not None else ""
        categories = {f.category for f in self.findings}
        if DATALOADER_HAZARD in categories and ("DataLoader" in message or "worker" in message or "prefetch_factor" in message or "persistent_workers" in message):
            return False
        if GRADSCALER_PROTOCOL in categories and any(text in message for text in _SCALER_ERRORS):
            return False
        if STREAM_RACE in categories and exc is not None and exc.type == "CUDASanitizerErrors":
            return False
        if any(f.category is Category.STAGE_ERROR for f in self.findings):
            return True
        self._crash_or_fail(first)
        return True

    def _target_crash(self, run: EntrypointRun, which: str) -> bool:
        """A crash of the target's own code in `which` run, as its `entrypoint-crash`; False
        (nothing added) when the run failed another way."""
        if not is_target_crash(self.ctx, run):
            return False
        setting = f" ({self.entrypoint.amp_setting(True)})" if self.entrypoint.amp_switch else ""
        what = f"The concurrency stage's {which} of {self.entrypoint.label}{setting}"
        self.findings.append(entrypoint_crash_finding(self.ctx, run, what, fallback=self.fallback))
        return True

    def _crash_or_fail(self, run: EntrypointRun) -> None:
        """A crash of the target's own code is its `entrypoint-crash`; anything else, the gate's."""
        if not self._target_crash(run, "instrumented run"):
            self._fail(run, f"the entrypoint {run.failure()}", reason="entrypoint-failed")

    def rerun_failed(self, run: EntrypointRun, which: str, details: DeterminismDetails) -> None:
        """A rerun that failed where run 1 returned: its failure, where it happened, instead of a
        divergence of training it never finished (an import that fails, state left by run 1)."""
        if not self._target_crash(run, which):
            self._fail(run, f"the {which} {run.failure()}", reason="rerun-failed", key=which)
        details.verdict = f"not compared further: the {which} {run.failure() or 'failed'}"


    # -- the outcome -------------------------------------------------------------------------------
    def _checks(self) -> ConcurrencyChecks:
        """Every check's record; one not reached says why it did not run."""
        not_run = CheckNote(ran=False, note=f"not run: {self.stopped or 'the instrumented run failed'}")
        streams = self.records.get(StreamRaces.name) or CheckNote(
            ran=False,
            note=f"not run: the CUDA sanitizer needs a CUDA device, and this run was on {self.ctx.device}" if not self.cuda else f"not run: {self.stopped}",
        )
        return ConcurrencyChecks(
            gradscaler=self.records.get(GradScalerProtocol.name) or not_run,
            dataloader=self.records.get(DataLoaderHazards.name) or not_run,
            nonblocking=self.records.get(NonBlockingCopies.name) or not_run,
            streams=streams,
            determinism=self.records.get(Determinism.name) or not_run,
        )

    def _compared(self) -> DeterminismDetails | None:
        """The determinism check's record where it compared runs (a note where it did not)."""
        record = self.records.get(Determinism.name)
        return record if isinstance(record, DeterminismDetails) else None

    def _outcome(self, first: EntrypointRun | None) -> StageOutcome:
        protocol: ProtocolDetails | None = self.records.get(GradScalerProtocol.name)
        determinism = self._compared()
        watched: LoaderDetails | None = self.records.get(DataLoaderHazards.name)
        loaders = watched.loaders if watched is not None else []
        metrics = [
            Metric(id="steps.observed", name="optimizer steps observed", value=protocol.steps if protocol else 0, note="in the instrumented run"),
            Metric(id="gradscaler.iterations_checked", name="GradScaler protocol iterations checked", value=protocol.iterations if protocol else 0),
            Metric(id="determinism.runs_compared", name="determinism runs compared", value=len(determinism.compared) + (1 if determinism.ran else 0) if determinism else 0),
            Metric(id="dataloaders.observed", name="DataLoaders observed", value=len(loaders), note=", ".join(f"{loader.site.path if loader.site else None}:{loader.site.line if loader.site else None} num_workers={loader.settings.num_workers}" for loader in loaders)[:200]),
            Metric(id="child_runs.wall_s", name="child runs wall time", value=self._runs_wall_s(), unit="s", note=f"{len(self.runs)} run(s) on {self.ctx.device}"),
        ]
        details = ConcurrencyDetails(device=self.ctx.device, budget_s=self.ctx.config.timeout_s, runs=self.runs, checks=self._checks(), stopped=self.stopped)
        return StageOutcome(
            summary=self._summary(),
            metrics=metrics,
            findings=self.findings,
            details=details.as_json(),  # a determinism record holds only the fields its check got to
            determinism=determinism.verdict if determinism is not None and determinism.ran else None,
        )

    def _summary(self) -> str:
        parts = [f"{len(self.runs)} run(s) on {self.ctx.device}"]
        protocol: ProtocolDetails | None = self.records.get(GradScalerProtocol.name)
        if protocol is not None:
            if protocol.scalers:
                parts.append(f"GradScaler protocol checked over {protocol.iterations} iteration(s)")
            else:
                # Most training loops use no scaler; "protocol checked" would claim a check that had nothing to check.
                parts.append(f"no GradScaler used ({protocol.steps} optimizer step(s) observed)")
        determinism = self._compared()
        if determinism is not None and determinism.ran:
            parts.append("runs " + (determinism.verdict or "compared").split(":")[0])
        if self.stopped:
            parts.append(f"stopped: {self.stopped}")
        if not self.cuda:
            parts.append("stream check not run (no CUDA)")
        return "; ".join(parts)

class Determinism:
    """nondeterminism: the instrumented run (the first determinism run) against reruns with
    another PYTHONHASHSEED; after a divergence, reruns that tell hash order from an unseeded
    source, and deterministic algorithms to name the op."""

    name = "determinism"
    reads = (TRACE, LOSSES, RNG)

    def evaluate(self, session: _Session) -> Checked:
        first = session.first
        assert first is not None  # it runs only after the instrumented run's checks
        if not first.ok:
            # Its failure is another check's finding (a loader worker, the scaler): a run that
            # stopped there computed nothing to compare, and its reruns would stop the same way.
            return Checked(record=CheckNote(ran=False, note=f"not compared: run 1 (the instrumented run) {(first.failure() or 'failed').splitlines()[0]}, so there was no training to compare"))
        base = _run_data(f"run 1 (instrumented, PYTHONHASHSEED={FIRST_HASH_SEED})", FIRST_HASH_SEED, first)
        # Set field by field as the check gets there: the fields never set stay out of the report.
        details = DeterminismDetails(ran=False, compared=[])
        divergence, other = None, None
        for index in range(1, session.ctx.section(ConcurrencyConfig).determinism_runs):
            if not session._budget_allows(first):
                return Checked([_out_of_budget(session, first, "the determinism rerun", check="determinism-rerun")], details)
            seed = _rerun_hash_seed(index)
            run = session._run(f"rerun-hashseed-{seed}", "determinism: same seeds, another PYTHONHASHSEED", [LOSSES, RNG], seed)
            if run is None:
                return Checked(record=details)
            if not run.ok:
                session.rerun_failed(run, f"determinism rerun with PYTHONHASHSEED={seed}", details)
                return Checked(record=details)
            other = _run_data(f"run {index + 1} (PYTHONHASHSEED={seed})", seed, run)
            details.compared.append(other.label)
            divergence = compare(base, other)
            if divergence is not None:
                break
        assert other is not None
        details.ran = True
        _kept, details.returned_ignored = comparable_leaves(first.record.returned if first.record is not None else None)
        details.curves = side_by_side(base, other, divergence)
        details.labels = [base.label, other.label]
        fingerprinted = len(base.fingerprinted)
        if divergence is None:
            details.verdict = f"identical: {len(base.losses)} optimizer step losses, the parameters after {fingerprinted} steps and the returned values matched exactly"
            return Checked(record=details)
        if divergence.where == "returned" and base.trained and other.trained:
            # Training computed the same thing; only something returned differs: worth saying, never a block.
            details.verdict = f"identical training ({len(base.losses)} step losses, parameters after {fingerprinted} steps); returned values differ at {divergence.describe()}"
            details.kind = "returned-only"
            return Checked([returned_only_finding(session.ctx, divergence, (base, other), session.fallback)], details)
        details.verdict = f"diverged at {divergence.describe()}"
        return Checked(self._classify(session, first, base, other, divergence, details), details)

    def _classify(self, session: _Session, first: EntrypointRun, base: RunData, other: RunData, divergence: Divergence, details: DeterminismDetails) -> list[Finding]:
        if not session._budget_allows(first):
            details.kind = "unclassified"
            return [nondeterminism_finding(session.ctx, "unclassified", divergence, (base, other), session.fallback, "No budget was left for the run that tells hash order from an unseeded source.", {})]
        run = session._run("rerun-same-hashseed", "determinism: same PYTHONHASHSEED as run 1", [LOSSES, RNG], FIRST_HASH_SEED)
        if run is None:
            return []
        if not run.ok:
            session.rerun_failed(run, f"determinism rerun with PYTHONHASHSEED={FIRST_HASH_SEED}", details)
            details.kind = "unclassified"
            explanation = "The rerun that tells hash order from an unseeded source failed (its own finding says how)."
            return [nondeterminism_finding(session.ctx, "unclassified", divergence, (base, other), session.fallback, explanation, {})]
        same = _run_data(f"run {len(details.compared) + 2} (PYTHONHASHSEED={FIRST_HASH_SEED})", FIRST_HASH_SEED, run)
        details.compared.append(same.label)
        same_divergence = compare(base, same)
        if same_divergence is None:
            return [self._hash_order(session, base, other, divergence, same, details)]
        details.curves = side_by_side(base, same, same_divergence)
        details.labels = [base.label, same.label]
        return self._same_hash(session, first, base, same, same_divergence, details)

    @staticmethod
    def _hash_order(session: _Session, base: RunData, other: RunData, divergence: Divergence, same: RunData, details: DeterminismDetails) -> Finding:
        details.kind = "hash-order"
        executed = set(base.target_modules) or None
        hints = set_iterations(session.ctx.root, executed)
        location = hints[0].location() if hints else session.fallback
        explanation = (
            f"{same.label} reproduced run 1 exactly, so the difference follows PYTHONHASHSEED: the order of a set (or of a "
            "dict built from one) of strings decides something the training depends on"
            + (f"; the source iterates a set at {hints[0].path}:{hints[0].line} (`{hints[0].code}`)" if hints else "")
            + "."
        )
        return nondeterminism_finding(
            session.ctx, "hash-order", divergence, (base, other), location, explanation,
            NondeterminismData(reproduced_by=same.label, static_hint=[h.as_dict() for h in hints[:10]], site_code=hints[0].code if hints else ""),
        )

    @staticmethod
    def _same_hash(session: _Session, first: EntrypointRun, base: RunData, same: RunData, divergence: Divergence, details: DeterminismDetails) -> list[Finding]:
        ctx = session.ctx
        causes = rng_causes(base, same)
        data = NondeterminismData(seeding_calls=causes[:10])
        if causes:
            cause = causes[0]
            site = cause["site"]  # a whole `Site`: the target's own calls are the ones recorded
            details.kind = "unseeded-random"
            location = location_of(site) if site["path"] else session.fallback
            explanation = f"The hash seed was the same, so a random source differs: `{cause['api']}` at {site['path']}:{site['line']} was {cause['why']} (seeds {cause['seeds']})."
            data["site_code"] = site["code"]
            return [nondeterminism_finding(ctx, "unseeded-random", divergence, (base, same), location, explanation, data)]
        race = _observed_race(session.findings)
        if race is not None:
            details.kind = "race"
            where = race.location
            at = f" at {where.path}:{where.line}" if where else ""
            explanation = (
                f"The hash seed was the same and no seeding call differed; this stage observed a {race.category}{at}: "
                "a read that races a copy or another stream's kernel sees values that differ from run to run."
            )
            data["site_code"] = race.category
            return [nondeterminism_finding(ctx, "race", divergence, (base, same), where or session.fallback, explanation, data)]
        op = None
        if session._budget_allows(first):
            run = session._run("deterministic", "determinism: torch.use_deterministic_algorithms(True)", [LOSSES], FIRST_HASH_SEED, deterministic=True)
            if run is None:
                return []
            op = deterministic_op(run)
        if op is not None:
            details.kind = "nondeterministic-op"
            frame = op["site"]  # the exception's target frame, when it has one
            location = location_of(frame) or session.fallback
            data["deterministic_rerun"] = op
            data["site_code"] = frame["code"] if frame is not None else op["op"]
            explanation = f"The hash seed was the same and no seeding call differed; with torch.use_deterministic_algorithms(True) the run stopped at `{op['op']}`, which has no deterministic implementation."
            return [nondeterminism_finding(ctx, "nondeterministic-op", divergence, (base, same), location, explanation, data)]
        details.kind = "same-hash-unlocated"
        hints = set_iterations(ctx.root, set(base.target_modules) or None)
        data["static_hint"] = [h.as_dict() for h in hints[:10]]
        explanation = "The hash seed was the same, no seeding call of the target differed and deterministic algorithms named no op; the source of the randomness was not observed."
        return [nondeterminism_finding(ctx, "same-hash-unlocated", divergence, (base, same), session.fallback, explanation, data)]


def _observed_race(findings: list[Finding]) -> Finding | None:
    """A race this stage observed on CUDA: the likeliest cause of a divergence with the same seeds."""
    return next((f for f in findings if f.category in (NONBLOCKING_RACE, STREAM_RACE) and f.evidence.kind is EvidenceKind.OBSERVED), None)


def _out_of_budget(session: _Session, first: EntrypointRun, what: str, check: str) -> Finding:
    """The stage-error of a check the budget left no time for; `check` names it, for the fingerprint."""
    ctx = session.ctx
    left = ctx.child_budget()
    session.stopped = f"no budget left for {what}"
    return ctx.stage_error(
        f"no budget left for {what}",
        reason="out-of-budget",
        key=check,
        title=f"The concurrency stage ran out of budget before {what}",
        problem=f"The instrumented run took {first.child.duration_s:.1f}s and only {left:.1f}s of the {ctx.config.timeout_s:.0f}s budget were left, not enough for {what}; the check did not run.",
        impact="Determinism was not checked, so the gate cannot vouch for it (fail closed).",
        fix="Raise `timeout_s` in [tool.traingate] (the stage needs about three times one run), or make the entrypoint's smoke kwargs smaller.",
        evidence=Evidence(kind=EvidenceKind.MEASURED, summary=f"{left:.1f}s left, one run takes {first.child.duration_s:.1f}s", data={"left_s": round(left, 2), "run_s": round(first.child.duration_s, 2)}),
    )


# Every check of the stage, in the order it runs: those that read the instrumented run
# (`checks.py`), then the one that makes runs of its own.
CHECKS: tuple[Check[InstrumentedRun], ...] = (GradScalerProtocol(), DataLoaderHazards(), NonBlockingCopies(), StreamRaces())
OWN_RUN_CHECKS: tuple[Check[_Session], ...] = (Determinism(),)


def _recorded(run: EntrypointRun) -> LossTracePayload | None:
    """The losses and parameter fingerprints the run recorded: the protocol trace's in the
    instrumented run, the loss recorder's in a rerun; None when it handed back neither."""
    trace = run.payload(TRACE, ProtocolTracePayload)
    return trace if trace is not None else run.payload(LOSSES, LossTracePayload)


def _rerun_hash_seed(index: int) -> str:
    """PYTHONHASHSEED of the determinism rerun `index` (1, 2, ...; run 1 has FIRST_HASH_SEED)."""
    return str(index)


def _run_data(label: str, hash_seed: str, run: EntrypointRun) -> RunData:
    recorded = _recorded(run)
    losses = list(recorded.losses) if recorded is not None else []
    return RunData(label, hash_seed, run, losses, run.payload(RNG, RngPayload), recorded.params if recorded is not None else None)
