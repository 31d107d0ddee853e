"""The correctness stage: training bugs that run fine, pass the tests and no speed check sees.

Runs (each a child process with the stage's remaining budget; past it, `hang`):
1. the instrumented run: optimizer step hooks fingerprinting the parameters across each step,
   with why a step changed nothing, the modules the run constructs, the gradient clipping, the
   loss of every backward call and the DataLoaders that fed the steps with a fingerprint of
   each sample (ineffective-step, unused-parameter, gradient-clipping, no-learning,
   unshuffled-training, data-leakage); the gradients each backward adds to (stale-gradients)
   and the mode of Dropout/BatchNorm at each forward and of functional dropouts
   (train-eval-mode); the inputs given to the losses, their kinds and shapes
   (loss-input-mismatch) and,
   once the entrypoint returned, the first training batch replayed in eval mode to chart which
   samples each output depends on (batch-mixing);
2. only with `accumulation_kwarg` and `batch_size_kwarg` configured: two runs ended after the
   first optimizer step, one accumulating k micro-batches of b, one with a batch of k*b
   (grad-accumulation);
3. only with `overfit_steps` configured: a run where every DataLoader repeats its first
   batch, ended after that many optimizer steps (no-learning: the loss must fall);
4. only with `[tool.traingate.distributed] nproc` configured: a run under torchrun with that
   many ranks, whose parameters, buffers and batches are compared across the ranks
   (ddp-divergence); ranks still running at its timeout are a `hang` located where the waiting
   rank waits, with every rank's stacks.
A finding exists only when it was observed or measured; a run that makes no optimizer step
is a stage-error (fail closed).
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from traingate.stages.correctness.config import DISTRIBUTED, CorrectnessConfig, CorrectnessPolicy, DistributedConfig
from traingate.stages.correctness.rules import CATEGORIES
from traingate.stages.correctness.probe.payloads import CORRECTNESS_FIRST_UPDATE as FIRST_UPDATE, CORRECTNESS_LOSSES as LOSSES, CORRECTNESS_MIXING as MIXING, CORRECTNESS_ONE_BATCH as ONE_BATCH, CORRECTNESS_RANKS as RANKS
from traingate.stages.correctness.details import (
    AccumulationCheck,
    CheckNote,
    CorrectnessChecks,
    CorrectnessDetails,
    CorrectnessRun,
    DistributedCheck,
    LoaderRow,
    Observed,
    OverfitCheck,
    RankLoaderRow,
    RankRow,
)
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Metric, StageOutcome
from traingate.stages.base import EntrypointRun, StageContext, no_entrypoint_outcome, run_entrypoint, with_leftover_findings
from traingate.stages.agent.checks import Check, Checked, run_checks
from traingate.stages.agent.observed_test import observed_test_note
from traingate.stages.contract import instruments
from traingate.stages.contract.messages import DistributedRecord, ExceptionRecord, RankResult
from traingate.stages.correctness.checks import (
    BatchMixing,
    DataLeakage,
    DiscardedBackward,
    FrozenOutput,
    GradientClipping,
    IneffectiveStep,
    InstrumentedRun,
    LossInputMismatch,
    NonFiniteLoss,
    StaleGradients,
    TrainEvalMode,
    TrainingFactsRecord,
    TrainingRegression,
    UnshuffledTraining,
    UnusedParameter,
)
from traingate.stages.correctness.probe.payloads import (
    FirstUpdatePayload,
    LoaderOrdering,
    LoadersPayload,
    LossesPayload,
    OneBatchPayload,
    RanksPayload,
    StepsPayload,
)
from traingate.stages.correctness import accumulation, divergence, located, overfit
from traingate.stages.correctness.torchrun import REPORT_ALLOWANCE_S, backend_for, run_distributed
from traingate.stages.agent.session import StageSession, run_outcome
from traingate.stages.agent.crash import entrypoint_crash_finding, is_target_crash
from traingate.stages.correctness.rules import NO_LEARNING

FIRST_STEP_REACHED = "FirstStepReached"
OVERFIT_STEPS_DONE = "OverfitStepsDone"


class CorrectnessWork:
    """The stage's work, run in its agent (`traingate.stages.correctness.spec.CorrectnessStage` is what the gate registers)."""

    def run(self, ctx: StageContext) -> StageOutcome:
        if ctx.config.entrypoint is None:
            return no_entrypoint_outcome("the correctness checks observe the training function's optimizer steps")
        return with_leftover_findings(ctx, _Session(ctx).run())


def instruments_read(checks: Iterable[Check[Any]]) -> list[str]:
    """The instruments the checks read, in the order they first read them; the batch-mixing
    replay last, as it runs the model once the others have collected."""
    read = list(dict.fromkeys(spec for check in checks for spec in check.reads))
    return [*(spec for spec in read if spec != MIXING), *([MIXING] if MIXING in read else [])]


class _Session(StageSession[CorrectnessRun]):
    stage = "correctness"

    def __init__(self, ctx: StageContext) -> None:
        super().__init__(ctx)
        self.observed: Observed | None = None  # None: no analysis read the instrumented run
        self.records: dict[str, Any] = {}  # each check's record for the report, by its name; absent: not reached
        self.first: EntrypointRun | None = None  # the instrumented run, once its checks have read it
        self.setup_note: str | None = None  # why the training was not observed with the baseline's setup

    def _run(self, label: str, purpose: str, specs: list[str], kwargs: dict[str, int] | None = None, options: dict[str, dict[str, int]] | None = None) -> EntrypointRun | None:
        run = run_entrypoint(
            self.ctx, label=label, amp=True if self.entrypoint.amp_switch else None, instruments=specs, kwargs_override=kwargs, options=options
        )
        record = CorrectnessRun(label=label, purpose=purpose, kwargs=kwargs or {}, duration_s=round(run.child.duration_s, 2), outcome=run_outcome(run))
        return self._record_run(run, record)

    def run(self) -> StageOutcome:
        specs = instruments_read(CHECKS)
        first = self._run("instrumented", "optimizer steps, parameters, losses, DataLoaders", specs)
        if first is None:
            return self._outcome()
        if first.result is None:
            self._fail(first, "the instrumented run ended without reporting", reason="no-result")
            return self._outcome()
        broken = [spec for spec in specs if first.instrument_error(spec) is not None]
        if broken:
            self._fail(first, f"instrument {broken[0]} failed", reason="instrument-failed", key=broken[0], detail=first.instrument_error(broken[0]))
            return self._outcome()
        facts = InstrumentedRun(self.ctx, first, self.fallback, self.findings)
        self.records.update(run_checks(CHECKS, facts, self.findings))
        steps = facts.steps
        self.observed = _observed(steps, facts.losses, facts.loaders)
        if steps is None or not steps.steps:
            if first.ok:
                self._fail(first, "the instrumented run returned without a single optimizer step", reason="no-optimizer-step", observed_nothing=True)
            else:
                self._fail(first, f"the entrypoint {first.failure()}", reason="entrypoint-failed")
            return self._outcome()
        if not first.ok and not any(f.category is NO_LEARNING for f in self.findings):
            self._fail(first, f"the entrypoint {first.failure()}", reason="entrypoint-failed")
            return self._outcome()
        self.first = first
        self.records.update(run_checks(OWN_RUN_CHECKS, self, self.findings))
        if self.ctx.baseline_setup:
            self._with_baseline_setup(specs)
        return self._outcome()

    def _with_baseline_setup(self, specs: list[str]) -> None:
        """The change edited the setup module the configuration names: the training is observed
        again with the baseline's form of it laid over this version's code (as the edited tests
        are replayed), so that a setup rewritten to build another model than the one users train
        is judged on what the baseline's builds. Its findings this version's own run did not have
        are reported, saying so; a run that cannot start with it (the setup's interface changed)
        is noted, not blocked."""
        work = Path(tempfile.mkdtemp())
        try:
            tree = work / self.ctx.root.name
            shutil.copytree(self.ctx.root, tree, symlinks=True)
            for path, text in self.ctx.baseline_setup.items():
                (tree / path).parent.mkdir(parents=True, exist_ok=True)
                (tree / path).write_text(text, encoding="utf-8")
            # Its own list of ended runs: it is not the configured training to compare unwatched.
            ctx = dataclasses.replace(self.ctx, root=tree, runs_left=[])
            run = run_entrypoint(ctx, label="baseline-setup", amp=True if self.entrypoint.amp_switch else None, instruments=specs)
            record = CorrectnessRun(label="baseline-setup", purpose="the training with the baseline's setup module", kwargs={}, duration_s=round(run.child.duration_s, 2), outcome=run_outcome(run))
            self.runs.append(record)
            if not run.ok or any(run.instrument_error(spec) is not None for spec in specs):
                self.setup_note = f"the baseline's setup module did not run on this version ({(run.failure() or 'an instrument failed').splitlines()[0][:200]}): its training was not observed again"
                return
            found: list[Finding] = []
            run_checks(CHECKS, InstrumentedRun(ctx, run, self.fallback, found), found)
            known = {f.id for f in self.findings}
            for finding in found:
                if finding.id not in known:
                    self.findings.append(finding.model_copy(update={
                        "title": f"{finding.title} (with the baseline's setup module)",
                        "problem": f"{finding.problem} Found with the baseline's form of the setup module the configuration names ({', '.join(self.ctx.baseline_setup)}), which this change edited: the training users run is built by it.",
                    }))
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def _fail(self, run: EntrypointRun, what: str, *, reason: str, key: str = "", detail: str | None = None, observed_nothing: bool = False) -> None:
        self.stopped = self.stopped or what
        super()._fail(run, what, reason=reason, key=key, detail=detail, observed_nothing=observed_nothing)

    # -- the outcome -------------------------------------------------------------------------------
    def _check_metrics(self) -> list[Metric]:
        """The opt-in checks' measurements against their policy thresholds, when they ran."""
        metrics = []
        accumulated = self.records.get(GradAccumulation.name)
        if isinstance(accumulated, AccumulationCheck):
            difference, tolerance = accumulated.relative_difference, accumulated.tolerance
            metrics.append(
                Metric(
                    id="grad_accumulation.relative_difference", name="gradient: accumulated vs one large batch", value=round(difference, 6),
                    threshold=tolerance, passed=difference <= tolerance, note=f"k={accumulated.accumulation}, b={accumulated.batch_size}",
                )
            )
        overfit_check = self.records.get(OverfitOneBatch.name)
        if isinstance(overfit_check, OverfitCheck) and overfit_check.reduction is not None:  # measured: `ran`
            reduction, required = overfit_check.reduction, overfit_check.required
            metrics.append(
                Metric(
                    id="overfit.loss_reduction", name="loss reduction on one repeated batch", value=round(reduction, 4),
                    threshold=required, passed=reduction >= required, note=f"{overfit_check.steps} steps",
                )
            )
        distributed = self.records.get(DistributedRun.name)
        if isinstance(distributed, DistributedCheck) and distributed.ran and distributed.parameters_differing is not None:
            differing = distributed.parameters_differing
            metrics.append(
                Metric(
                    id="distributed.parameters_differing", name="parameters that differ across ranks after training", value=differing,
                    threshold=0, passed=differing == 0, note=f"{distributed.nproc} ranks under torchrun, {distributed.backend}",
                )
            )
        return metrics

    def _checks(self) -> CorrectnessChecks:
        """Every check's record; one not reached says why it did not run."""
        not_run = CheckNote(ran=False, note=f"not run: {self.stopped or 'the instrumented run failed'}")
        record = self.records.get
        checks = CorrectnessChecks(
            stale_gradients=record(StaleGradients.name) or not_run,
            train_eval_mode=record(TrainEvalMode.name) or not_run,
            loss_input_mismatch=record(LossInputMismatch.name) or not_run,
            batch_mixing=record(BatchMixing.name) or not_run,
            grad_accumulation=record(GradAccumulation.name) or not_run,
            overfit=record(OverfitOneBatch.name) or not_run,
            distributed=record(DistributedRun.name) or not_run,
        )
        # Left unset (out of the report) when not recorded: no facts handed back, no baseline.
        if record(TrainingFactsRecord.name) is not None:
            checks.training_facts = record(TrainingFactsRecord.name)
        if record(TrainingRegression.name) is not None:
            checks.baseline = record(TrainingRegression.name)
        if self.observed is not None:  # left unset (out of the report) when no analysis read the run
            checks.observed = self.observed
        return checks

    def _outcome(self) -> StageOutcome:
        observed = self.observed
        steps = observed.steps if observed is not None else 0
        counts = {c: sum(1 for f in self.findings if f.category is c) for c in CATEGORIES}
        metrics = [
            Metric(id="steps.observed", name="optimizer steps observed", value=steps, note="in the instrumented run"),
            Metric(id="backward.observed", name="backward calls observed", value=observed.backward_calls if observed is not None else 0),
            Metric(id="modules.observed", name="modules constructed", value=observed.modules if observed is not None else 0),
            Metric(id="dataloaders.observed", name="DataLoaders observed", value=len(observed.loaders) if observed is not None else 0),
            *self._check_metrics(),
            Metric(id="child_runs.wall_s", name="child runs wall time", value=self._runs_wall_s(), unit="s", note=f"{len(self.runs)} run(s) on {self.ctx.device}"),
        ]
        summary = [f"{len(self.runs)} run(s) on {self.ctx.device}", f"{steps} optimizer step(s) observed"]
        summary += [f"{n} {c.value}" for c, n in sorted(counts.items(), key=lambda item: item[0].value) if n]
        accumulated = self.records.get(GradAccumulation.name)
        if isinstance(accumulated, AccumulationCheck):
            summary.append(f"gradient accumulation compared ({accumulated.relative_difference:.2%} off)")
        if self.stopped:
            summary.append(f"stopped: {self.stopped}")
        if self.ctx.baseline_setup:
            summary.append(self.setup_note or "the training observed again with the baseline's setup module, which this change edited")
        details = CorrectnessDetails(device=self.ctx.device, budget_s=self.ctx.config.timeout_s, runs=self.runs, checks=self._checks(), stopped=self.stopped)
        return StageOutcome(
            summary="; ".join(summary),
            metrics=metrics,
            findings=self.findings,
            details=details.as_json(),  # `observed` and a distributed record's later fields only once reached
        )


def _first_run(session: _Session) -> EntrypointRun:
    assert session.first is not None  # the checks below run only after the instrumented run's
    return session.first

class GradAccumulation:
    """grad-accumulation, opt-in (`accumulation_kwarg` and `batch_size_kwarg`): two runs ended
    after the first optimizer step, one accumulating k micro-batches of b, one with a batch of
    k*b; their first updates must agree."""

    name = "grad_accumulation"
    reads = (FIRST_UPDATE, LOSSES)

    def evaluate(self, session: _Session) -> Checked:
        config = session.ctx.section(CorrectnessConfig)
        if session.entrypoint.test is not None:  # whether the keywords are set or not
            return Checked(record=CheckNote(ran=False, note=observed_test_note(session.entrypoint.test, "runs with the accumulation and batch size keywords set")))
        if config.accumulation_kwarg is None or config.batch_size_kwarg is None:
            return Checked(record=CheckNote(ran=False, note="not configured: set accumulation_kwarg and batch_size_kwarg in [tool.traingate.correctness]"))
        batch = session.entrypoint.kwargs.get(config.batch_size_kwarg)
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            return Checked([_config_error(session, f"[tool.traingate.entrypoint] kwargs sets no integer `{config.batch_size_kwarg}`: the micro-batch size b is unknown")])
        k = config.accumulation
        setup: accumulation.Setup = {"accumulation_kwarg": config.accumulation_kwarg, "batch_size_kwarg": config.batch_size_kwarg, "accumulation": k, "batch_size": batch}
        runs = self._first_updates(session, {
            "accumulated": {config.accumulation_kwarg: k, config.batch_size_kwarg: batch},
            "large-batch": {config.accumulation_kwarg: 1, config.batch_size_kwarg: k * batch},
        })
        if runs is None:
            return Checked()
        (accumulated, accumulated_update), (_, large_update) = runs
        comparison = accumulation.compare_first_updates(accumulated_update, large_update)
        if comparison is None:
            session._fail(accumulated, "the two gradient-accumulation runs' parameters do not line up, a first-step gradient is not finite, or the large batch's gradient is zero", reason="accumulation-incomparable")
            return Checked()
        losses = accumulated.payload(LOSSES, LossesPayload)
        calls = losses.calls if losses is not None else None
        record = AccumulationCheck(
            ran=True, **setup, **comparison, tolerance=session.ctx.thresholds(CorrectnessPolicy).grad_accumulation_tolerance, backward_calls_before_step=calls
        )
        return Checked(accumulation.accumulation_finding(session.ctx, comparison, losses, setup, session.fallback), record)

    @staticmethod
    def _first_updates(session: _Session, settings: dict[str, dict[str, int]]) -> list[tuple[EntrypointRun, FirstUpdatePayload]] | None:
        """One run per setting, each ended at its first optimizer step, with its first update;
        None (failed closed) when the budget ran out or a run made no step."""
        first = _first_run(session)
        runs: list[tuple[EntrypointRun, FirstUpdatePayload]] = []
        for label, kwargs in settings.items():
            if session.ctx.child_budget() < first.child.duration_s + 2.0:
                session.stopped = f"no budget left for the {label} run"
                session._fail(first, f"no budget left for the gradient-accumulation {label} run", reason="out-of-budget", key="grad-accumulation")
                return None
            run = session._run(label, "grad-accumulation: one update", [FIRST_UPDATE, LOSSES], kwargs)
            if run is None:
                return None
            update = run.payload(FIRST_UPDATE, FirstUpdatePayload)
            if run.raised is None or run.raised.type != FIRST_STEP_REACHED or update is None or not update.stepped:
                session._fail(run, f"the gradient-accumulation {label} run made no optimizer step", reason="accumulation-run-failed", key=label)
                return None
            runs.append((run, update))
        return runs


def _config_error(session: _Session, what: str) -> Finding:
    """The stage-error of a gradient-accumulation check the configuration asks for and cannot set up."""
    session.stopped = what
    return session.ctx.stage_error(
        what,
        reason="accumulation-setup",
        key="grad-accumulation",
        title="The correctness stage could not set up the gradient-accumulation check",
        problem=f"{what}; the check did not run.",
        impact="Gradient accumulation was not checked although the configuration asks for it, so the gate blocks (fail closed).",
        fix="Give the micro-batch size in [tool.traingate.entrypoint] kwargs under the name `batch_size_kwarg` names.",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=what),
    )


class OverfitOneBatch:
    """no-learning, opt-in (`overfit_steps`): a run where every DataLoader repeats its first
    batch, ended after that many optimizer steps; the loss must fall."""

    name = "overfit"
    reads = (ONE_BATCH, LOSSES)

    def evaluate(self, session: _Session) -> Checked:
        limit = session.ctx.section(CorrectnessConfig).overfit_steps
        if limit is None:
            return Checked(record=CheckNote(ran=False, note="not configured: set overfit_steps in [tool.traingate.correctness]"))
        if session.stopped:
            return Checked()
        first = _first_run(session)
        if session.ctx.child_budget() < first.child.duration_s + 2.0:
            session._fail(first, "no budget left for the one-batch overfit run", reason="out-of-budget", key="overfit")
            return Checked()
        run = session._run("overfit-one-batch", f"no-learning: {limit} steps on one repeated batch", [ONE_BATCH, LOSSES], options={"correctness": {"overfit_steps": limit}})
        if run is None:
            return Checked()
        watch, losses = run.payload(ONE_BATCH, OneBatchPayload), run.payload(LOSSES, LossesPayload)
        stopped_here = run.raised is not None and run.raised.type == OVERFIT_STEPS_DONE
        if not (run.ok or stopped_here) or run.instrument_error(ONE_BATCH) is not None:
            session._fail(run, "the one-batch overfit run failed", reason="overfit-run-failed", key="overfit")
            return Checked()
        if watch is None or not watch.loaders or not watch.batches_repeated:
            session._fail(run, "the one-batch overfit run repeated no DataLoader batch (the entrypoint feeds its batches without a DataLoader)", reason="overfit-no-dataloader", key="overfit")
            return Checked()
        curve = overfit.step_losses(losses)
        fraction = overfit.reduction(curve)
        record = OverfitCheck(
            ran=fraction is not None,
            steps=watch.steps,
            limit=limit,
            reduction=fraction,
            required=session.ctx.thresholds(CorrectnessPolicy).overfit_min_reduction,
            first_loss=curve[0] if curve else None,
            last_losses=list(curve[-overfit.TAIL:]),
            note=None if fraction is not None else "not judged: too few steps, or a first loss that is not positive (a reduction fraction is undefined)",
        )
        if fraction is None or losses is None:  # a reduction is measured on the losses
            return Checked(record=record)
        return Checked(overfit.overfit_finding(session.ctx, curve, fraction, losses, watch.steps, session.fallback), record)


class DistributedRun:
    """ddp-divergence, opt-in (`[tool.traingate.distributed] nproc`): a run under torchrun with
    that many ranks, whose parameters, buffers and batches are compared across the ranks; ranks
    still running at its timeout are a `hang` where the waiting rank waits."""

    name = "distributed"
    reads = (RANKS,)
    label = "distributed"

    def evaluate(self, session: _Session) -> Checked:
        config = session.ctx.config.optional_section(DISTRIBUTED, DistributedConfig)
        if session.entrypoint.test is not None:  # whether [distributed] is set or not
            return Checked(record=CheckNote(ran=False, note=observed_test_note(session.entrypoint.test, "a run under torchrun")))
        if config is None:
            return Checked(record=CheckNote(ran=False, note="not configured: set nproc in [tool.traingate.distributed]"))
        if session.stopped:
            return Checked()
        first, label = _first_run(session), self.label
        timeout = min(config.timeout_s, session.ctx.child_budget() - REPORT_ALLOWANCE_S)
        if timeout < first.child.duration_s + 2.0:
            session._fail(first, "no budget left for the distributed run", reason="out-of-budget", key="distributed")
            return Checked()
        amp = True if session.entrypoint.amp_switch else None
        run = run_distributed(session.ctx, label=label, nproc=config.nproc, timeout_s=timeout, instruments=[RANKS], amp=amp)
        record = run.record.distributed if run.record is not None else None
        session.runs.append(
            CorrectnessRun(
                label=label, purpose=f"ddp-divergence: {config.nproc} ranks under torchrun", kwargs={},
                duration_s=round(run.child.duration_s, 2), outcome=_distributed_outcome(run, record),
            )
        )
        # Set field by field as the run gets there: the fields never set stay out of the report.
        check = DistributedCheck(ran=False, nproc=config.nproc, backend=backend_for(session.ctx.device), timeout_s=round(timeout, 2))
        if run.child.timed_out or record is None:
            # The harness reports the ranks' timeout itself; the child overrunning its own budget,
            # or handing back nothing, is the gate's failure.
            session.stopped = f"the {label} run handed back no result"
            session._fail(run, f"the {label} run handed back no result", reason="distributed-no-result", key=label)
            return Checked(record=check)
        check.start_method = record.start_method
        check.duration_s = round(record.duration_s, 2)
        check.ranks = [RankRow(rank=r.rank, ending=r.ending, duration_s=r.duration_s) for r in record.ranks]
        what = f"The correctness stage's distributed run ({config.nproc} ranks under torchrun) of {session.entrypoint.label}"
        return Checked(self._ranks(session, run, record, check, what), check)

    def _ranks(self, session: _Session, run: EntrypointRun, record: DistributedRecord, check: DistributedCheck, what: str) -> list[Finding]:
        """What the ranks of the distributed run that handed back a result did: a launch
        failure, a hang, a failed rank, or their payloads compared."""
        label = self.label
        if record.launcher_error:
            session._fail(run, "torchrun could not launch the ranks", reason="distributed-launch", key=label, detail=record.launcher_error)
            return []
        if record.timed_out:
            session.stopped = f"the {label} run did not finish within {record.timeout_s:g}s"
            return [divergence.distributed_hang(session.ctx, record, session.fallback, what)]
        failed = _first_failure(record.ranks)
        if failed is not None:
            session.stopped = f"rank {failed.rank} of the {label} run {failed.ending}"
            as_run = _rank_run(run, failed)
            if is_target_crash(session.ctx, as_run):
                return [entrypoint_crash_finding(session.ctx, as_run, f"{what}, rank {failed.rank},", fallback=session.fallback)]
            session._fail(as_run, f"rank {failed.rank} of the {label} run {failed.ending}", reason="distributed-rank-failed", key=label, detail=failed.stacks or None)
            return []
        payloads = [r.instruments.get(RANKS, {}) for r in record.ranks]
        broken = next((w for w in payloads if instruments.collect_error(w) is not None or "tensors" not in w), None)
        if broken is not None:
            session._fail(run, f"instrument {RANKS} failed in the {label} run", reason="instrument-failed", key=RANKS, detail=instruments.collect_error(broken))
            return []
        watches = [RanksPayload.model_validate(w) for w in payloads]
        if not all(w.steps for w in watches):
            session._fail(run, f"a rank of the {label} run made no optimizer step", reason="no-optimizer-step", key=label)
            return []
        found = divergence.divergence_findings(session.ctx, watches, session.fallback)
        check.ran = True
        check.steps_per_rank = [w.steps for w in watches]
        check.ddp_wrapped = bool(watches[0].ddp)
        check.tensors_compared = len(watches[0].tensors)
        check.parameters_differing = divergence.differing_parameters(watches)
        check.loaders = [RankLoaderRow(sampler=loader.sampler, steps=loader.steps, batches=loader.batches) for loader in watches[0].loaders]
        check.findings = len(found)
        return found


# Every check of the stage, in the order it runs: those that read the instrumented run
# (`checks.py`; the instruments it installs are the ones they read), then those that make
# runs of their own (above).
CHECKS: tuple[Check[InstrumentedRun], ...] = (
    IneffectiveStep(), UnusedParameter(), GradientClipping(), NonFiniteLoss(), UnshuffledTraining(), DataLeakage(),
    StaleGradients(), DiscardedBackward(), TrainEvalMode(), LossInputMismatch(), FrozenOutput(), BatchMixing(),
    TrainingFactsRecord(), TrainingRegression(),
)
OWN_RUN_CHECKS: tuple[Check[_Session], ...] = (GradAccumulation(), OverfitOneBatch(), DistributedRun())


def _observed(steps: StepsPayload | None, losses: LossesPayload | None, loaders: LoadersPayload | None) -> Observed:
    """What the instrumented run was seen doing, for the stage's details (nothing of a payload
    the run did not hand back)."""
    return Observed(
        steps=steps.steps if steps is not None else 0,
        # The construction site is an index into the payload's own table: not the details' to carry.
        optimizers=[o.model_copy(update={"site": None}) for o in steps.optimizers] if steps is not None else [],
        modules=steps.modules_seen if steps is not None else 0,
        backward_calls=losses.calls if losses is not None else 0,
        loaders=[_loader_row(loaders, loader) for loader in loaders.loaders] if loaders is not None else [],
    )


def _loader_row(loaders: LoadersPayload, loader: LoaderOrdering) -> LoaderRow:
    return LoaderRow(
        site=located.site(loaders, loader.site), epochs=loader.epochs, batches=loader.batches, steps=loader.steps, sampler=loader.sampler,
        sampler_module=loader.sampler_module, batch_sampler=loader.batch_sampler, sampler_shuffles=loader.sampler_shuffles,
        set_epoch_calls=loader.set_epoch_calls, length=loader.length, iterable_dataset=loader.iterable_dataset,
    )


def _distributed_outcome(run: EntrypointRun, record: DistributedRecord | None) -> str:
    """How the distributed run went, in a few words, for the stage's list of runs."""
    outcome = run.failure() or "returned"
    if record is not None and not run.ok:
        first_failed = _first_failure(record.ranks)
        if record.timed_out:
            outcome = f"ranks still running at the {record.timeout_s:g}s timeout"
        elif first_failed is not None:
            outcome = f"rank {first_failed.rank} {first_failed.ending}"
    return outcome


def _first_failure(ranks: list[RankResult]) -> RankResult | None:
    """The rank whose failure the others followed: one that died before reporting (the harness
    catches every exception, so the target ended that process), else one that raised something
    other than a collective's error (which a peer's death causes), else the first that failed."""
    died = [r for r in ranks if not r.reported and r.exit_status is not None]
    raised = [r for r in ranks if r.exception is not None]
    own = [r for r in raised if r.exception is not None and not _collective_error(r.exception)]
    for group in (died, own, raised, [r for r in ranks if not r.ok]):
        if group:
            return group[0]
    return None


def _collective_error(exception: ExceptionRecord) -> bool:
    """An error a collective raises when a peer is gone (gloo's connection reset, NCCL's abort)."""
    return exception.type.startswith("Dist") or "gloo" in exception.message or "NCCL" in exception.message


def _rank_run(run: EntrypointRun, rank: RankResult) -> EntrypointRun:
    """One rank of a distributed run seen as a run of its own: its exception, or its exit status
    and its stack dumps, for the crash finding to be located in the rank's own code."""
    child = dataclasses.replace(run.child, stacks=rank.stacks, returncode=rank.exit_status if rank.exit_status is not None else run.child.returncode)
    if not rank.reported:
        return EntrypointRun(child=child, result=None)
    exception = rank.exception.model_dump(mode="json") if rank.exception is not None else None
    result = {**(run.result or {}), "ok": rank.ok, "phase": rank.phase or "call", "exception": exception}
    return EntrypointRun(child=child, result=result)
