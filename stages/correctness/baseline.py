"""`training-regression`: a training fact that held in the `--baseline` report's run fails in
this one (docs/baseline-comparison.md).

Three facts are judged, each only where the baseline had it:
- the loss fell: the mean of the first tenth of the steps (at least 3) against the last
  tenth's. A regression when the baseline's fell by at least LOSS_MIN_FALL and this run's by
  less than LOSS_KEPT of the baseline's fall (a working change that learns slower, with half
  the steps or a lower learning rate, keeps more than that);
- the learning rate's schedule: each optimizer group's last-step lr over its first-step lr. A
  regression when this run's ratio is below the baseline's / LR_COLLAPSE (a schedule that
  decays 100 times faster); another base lr keeps the ratio;
- symmetry: a weight matrix of the same name whose rows were at least half distinct in the
  baseline and whose share of distinct rows is now below ROWS_KEPT of the baseline's (a
  randomly initialised matrix keeps every row distinct, a dead ReLU unit's included; a
  constant initialisation leaves rows alike, the bias alone telling some apart).
Samples per epoch, the kind of each loss's input and the evaluation outputs: `baseline_observed`.
A fact that differs by more than CHANGED but is no regression is listed as "changed, not worse".
"""

from __future__ import annotations

from traingate.stages.correctness.details import BaselineFactsCheck, TrainingFacts
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location, PipelineReport, Severity
from traingate.stages.base import StageContext
from traingate.stages.correctness.probe.payloads import FactsPayload, LoadersPayload, LossInputsPayload
from traingate.stages.contract.payloads.base import Site
from traingate.stages.correctness import baseline_observed, changed_lines, located
from traingate.stages.correctness.rules import TRAINING_REGRESSION

CATEGORY = TRAINING_REGRESSION
LOSS_MIN_FALL = 0.2
LOSS_KEPT = 0.25
LR_COLLAPSE = 100.0
CHANGED = 0.01
MIN_STEPS = 6
ROWS_KEPT = 0.9


def baseline_facts(baseline: PipelineReport | None) -> TrainingFacts | None:
    """The baseline report's training facts; None where it recorded none."""
    if baseline is None:
        return None
    for stage in baseline.stages:
        if stage.name == "correctness" and isinstance(stage.details, dict):
            facts = stage.details.get("checks", {}).get("training_facts")
            return TrainingFacts.model_validate(facts) if isinstance(facts, dict) else None
    return None


def loss_fall(losses: list[float | None]) -> float | None:
    """1 - mean(last tenth) / mean(first tenth); None when undefined."""
    values = [v for v in losses if v is not None]
    if len(values) < MIN_STEPS or len(values) != len(losses):
        return None
    part = max(3, len(values) // 10)
    first, last = sum(values[:part]) / part, sum(values[-part:]) / part
    return None if first <= 0 else 1.0 - last / first


class Comparison:
    """The three facts compared; findings built with `ctx` and located in `payload`'s lines."""

    def __init__(self, ctx: StageContext, now: TrainingFacts, then: TrainingFacts, payload: FactsPayload, fallback: Location) -> None:
        self.ctx, self.now, self.then, self.payload, self.fallback = ctx, now, then, payload, fallback
        self.loaders: LoadersPayload | None = None
        self.inputs: LossInputsPayload | None = None
        self.explained: set[Category] = set()
        self.sites: list[Site] = []  # the target lines the run's instruments recorded (it executed them)
        self._nearest: Location | None = None
        self.check = BaselineFactsCheck(ran=True, note=None, compared=[], regressions=[], changed_not_worse=[], baseline_losses=then.losses)
        self.findings: list[Finding] = []

    def run(self) -> tuple[list[Finding], BaselineFactsCheck]:
        """A loss that stopped falling is its own finding only where no nearer fact explains it
        (one finding per cause: a collapsed learning rate's finding states the loss too)."""
        self._learning_rates()
        self._symmetry()
        baseline_observed.samples(self, self.loaders)
        baseline_observed.evaluation(self)
        elsewhere = baseline_observed.loss_inputs(self, self.inputs, self.explained)
        elsewhere = baseline_observed.modules(self, self.explained) or elsewhere
        causes = list(self.findings)
        self._loss()
        if (causes or elsewhere) and len(self.findings) > len(causes):
            loss = self.findings.pop()
            also = f" Also, {loss.evidence.summary}."
            self.findings = [f.model_copy(update={"problem": f.problem + also}) for f in causes]
            if not causes:  # the cause is a named rule's finding of this run
                self.check.regressions[-1] += " (its cause stated in this run's other findings)"
        return self.findings, self.check

    def changed(self, fact: str, then: float, now: float) -> None:
        if abs(now - then) > CHANGED * max(abs(then), abs(now), 1e-12):
            self.check.changed_not_worse.append(fact)

    def _loss(self) -> None:
        then, now = loss_fall(self.then.losses), loss_fall(self.now.losses)
        if then is None or now is None:
            return
        self.check.compared.append("loss fall")
        statement = f"the training loss {_moved(then)} over {len(self.then.losses)} steps in the baseline and {_moved(now)} over {len(self.now.losses)} now"
        if then >= LOSS_MIN_FALL and now < LOSS_KEPT * then:
            self.found("loss", statement, self.nearest(), {"baseline_fall": then, "fall": now})
        else:
            self.changed(statement, then, now)

    def _learning_rates(self) -> None:
        then, now = _lr_curves(self.then), _lr_curves(self.now)
        for key in sorted(set(then) & set(now)):
            old, new = then[key], now[key]
            if not old or not new or not old[0] or not new[0]:
                continue
            self.check.compared.append(f"learning rate of optimizer {key[0]} group {key[1]}")
            old_ratio, new_ratio = old[-1] / old[0], new[-1] / new[0]
            statement = f"the learning rate at the last step was {old[-1]:.3g} in the baseline and {new[-1]:.3g} now"
            if new_ratio * LR_COLLAPSE < old_ratio:
                after = _diverged(old, new)
                statement += f" (changed after step {after} of {len(new)})" if after is not None else ""
                self.found(f"lr-{key[0]}-{key[1]}", statement, self._scheduler_location(), {"baseline_lrs": old[:500], "lrs": new[:500]})
            else:
                self.changed(statement, old[-1], new[-1])

    def _symmetry(self) -> None:
        then = {m.name: m for m in self.then.matrices}
        for matrix in self.now.matrices:
            old = then.get(matrix.name)
            if old is None:
                continue
            self.check.compared.append(f"distinct rows of `{matrix.name}`")
            statement = f"`{matrix.name}` had {old.distinct} distinct rows of {old.rows} in the baseline and {matrix.distinct} of {matrix.rows} now"
            if 2 * old.distinct >= old.rows and matrix.distinct / matrix.rows < ROWS_KEPT * old.distinct / old.rows:
                where = located.location(self.payload, matrix.init_site, self.fallback)
                self.found(f"rows-{matrix.name}", statement, where, {"baseline": old.model_dump(), "now": matrix.model_dump()})
            elif (old.distinct, old.rows) != (matrix.distinct, matrix.rows):
                self.check.changed_not_worse.append(statement)

    def nearest(self) -> Location:
        """Where a fact no nearer line explains is located: a line the change since the
        baseline's commit touched (`changed_lines`), else the entrypoint. Read once, when needed."""
        if self._nearest is None:
            commit = self.ctx.baseline.target.commit if self.ctx.baseline is not None else None
            changed = changed_lines.changed_lines(self.ctx.origin, commit)
            self._nearest = (changed_lines.nearest_changed(changed, self.sites, self.fallback) if changed else None) or self.fallback
        return self._nearest

    def _scheduler_location(self) -> Location:
        sites = self.payload.scheduler_sites
        busiest = max(sites, key=lambda s: s.steps).site if sites else None
        return located.location(self.payload, busiest, self.fallback)

    def found(self, key: str, statement: str, where: Location, data: dict[str, object]) -> None:
        self.check.regressions.append(statement)
        self.findings.append(
            self.ctx.finding(
                category=CATEGORY,
                severity=Severity.HIGH,
                title=statement[0].upper() + statement[1:],
                location=where,
                problem=f"The same smoke run as the baseline's, with the same seeds: {statement}. The baseline trained; this version does not train the same way.",
                impact="A change that runs and passes its tests but trains worse: the model this version produces is worse than the one it replaces.",
                fix="Compare the change with the baseline around the located line (a shuffle, a scheduler's step(), an initialisation); if the change is intended, say so by taking this report as the new baseline once reviewed.",
                evidence=Evidence(kind=EvidenceKind.MEASURED, summary=statement, data=data),
                key=f"baseline-{key}",
            )
        )


def _moved(fall: float) -> str:
    """A loss's fall as a reader says it: "fell 58%", "rose 7%" (a negative fall)."""
    return f"fell {fall:.0%}" if fall >= 0 else f"rose {-fall:.0%}"


def _lr_curves(facts: TrainingFacts) -> dict[tuple[int, int], list[float]]:
    """(optimizer, group) -> its lr at each of its steps (numbers only)."""
    curves: dict[tuple[int, int], list[float]] = {}
    for record in facts.records:
        for group, lr in enumerate(record.lrs):
            if lr is not None:
                curves.setdefault((record.optimizer, group), []).append(lr)
    return curves


def _diverged(old: list[float], new: list[float]) -> int | None:
    """The last step (1-based) whose lr, relative to the first, both runs shared."""
    for index, (a, b) in enumerate(zip(old, new, strict=False)):
        if abs(a / old[0] - b / new[0]) > CHANGED * abs(a / old[0]):
            return index
    return None


def compare(
    ctx: StageContext, now: TrainingFacts | None, payload: FactsPayload | None, fallback: Location, explained: set[Category] | None = None,
    loaders: LoadersPayload | None = None, inputs: LossInputsPayload | None = None, sites: list[Site] | None = None,
) -> tuple[list[Finding], BaselineFactsCheck | None]:
    """None without a baseline: nothing changes. `explained`: the categories this run found
    already (a fact one of them states is not found again); `loaders`, `inputs`: where the
    samples' and the losses' facts were observed, for their lines; `sites`: the other lines
    the run's instruments recorded (a changed one among them locates the loss's finding)."""
    if ctx.baseline is None:
        return [], None
    then = baseline_facts(ctx.baseline)
    if then is None:
        return [], _not_compared("the baseline report records no training facts (an older gate, or its correctness stage did not run)")
    if now is None or payload is None:
        return [], _not_compared("this run recorded no training facts")
    comparison = Comparison(ctx, now, then, payload, fallback)
    comparison.loaders, comparison.inputs, comparison.explained = loaders, inputs, explained or set()
    comparison.sites = [*payload.sites, *(sites or [])]
    return comparison.run()


def add_observed(facts: TrainingFacts, payload: FactsPayload, loaders: LoadersPayload | None, inputs: LossInputsPayload | None) -> None:
    baseline_observed.add_observed(facts, payload, loaders, inputs)


def _not_compared(why: str) -> BaselineFactsCheck:
    return BaselineFactsCheck(ran=False, note=why, compared=[], regressions=[], changed_not_worse=[])
