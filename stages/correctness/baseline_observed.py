"""`training-regression`'s facts read from what other instruments observed too
(docs/baseline-comparison.md): the samples the training loaders handed out per epoch, the kind
of input each classification loss was given, and whether a model run twice under no_grad on
the same input gave the same output.

- samples per epoch: a regression when this run's are below SAMPLES_KEPT of the baseline's (a
  loader over part of the data); another batch size keeps them;
- a loss's input: a regression when a loss of the same function was given the kind it expects
  in the baseline and now a kind it does not (cross_entropy given probabilities, nll_loss given
  logits or probabilities, binary_cross_entropy_with_logits given values in [0, 1]); where the
  run has a `loss-input-mismatch` finding, that finding is the one for the cause;
- evaluation: a regression when every check gave the same output twice in the baseline and one
  does not now (a model left in train mode for its evaluation, dropout applied in eval mode);
- each top-level module's change over the run: a regression when a module held by an optimizer
  in both runs changed by less than MODULE_KEPT of its baseline change (frozen now). A module no
  optimizer holds now is the `unused-parameter` finding's where there is one, else listed as
  changed (a module renamed by a refactor is not held under its old name).
"""

from __future__ import annotations

from typing import Protocol

from traingate.stages.correctness.details import BaselineFactsCheck, LossInputFact, TrainingFacts
from traingate.pipeline.model.schema import Category, Location
from traingate.stages.correctness.probe.payloads import FactsPayload, LoadersPayload, LossInputsPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import LOSS_INPUT_MISMATCH, UNUSED_PARAMETER

SAMPLES_KEPT = 0.5
MODULE_KEPT = 0.01
# The kinds of input each loss does not expect (probe.loss_inputs.classify's names).
WRONG_KINDS = {
    "cross_entropy": ("probabilities",),
    "nll_loss": ("logits", "probabilities"),
    "binary_cross_entropy_with_logits": ("unit-interval",),
}


class Judge(Protocol):
    """The comparison a fact is judged in (`baseline.Comparison`)."""

    now: TrainingFacts
    then: TrainingFacts
    payload: FactsPayload
    fallback: Location
    check: BaselineFactsCheck

    def found(self, key: str, statement: str, where: Location, data: dict[str, object]) -> None: ...

    def changed(self, fact: str, then: float, now: float) -> None: ...

    def nearest(self) -> Location: ...


def add_observed(facts: TrainingFacts, payload: FactsPayload, loaders: LoadersPayload | None, inputs: LossInputsPayload | None) -> None:
    """The facts read from the loaders' and the losses' instruments, where they observed them."""
    training = [loader for loader in (loaders.loaders if loaders is not None else []) if loader.steps and loader.epochs]
    if training:
        facts.samples_per_epoch = round(sum(loader.samples / loader.epochs for loader in training))
    if inputs is not None and inputs.losses:
        facts.loss_inputs = [LossInputFact(function=s.function, kind=s.kind, shape=s.shape, dtype=s.dtype) for s in inputs.losses if s.gradients_recorded]
    if payload.evaluation is not None:
        facts.evaluation = payload.evaluation


def samples(judge: Judge, loaders: LoadersPayload | None) -> None:
    then, now = judge.then.samples_per_epoch, judge.now.samples_per_epoch
    if not then or now is None:
        return
    judge.check.compared.append("samples per epoch")
    statement = f"the training data loaders handed out {then} samples per epoch in the baseline and {now} now"
    if now < SAMPLES_KEPT * then:
        busiest = max((lo for lo in loaders.loaders if lo.steps), key=lambda lo: lo.steps, default=None) if loaders is not None else None
        where = located.location(loaders, busiest.site if busiest is not None else None, judge.fallback)
        judge.found("samples", statement, where, {"baseline_samples_per_epoch": then, "samples_per_epoch": now})
    else:
        judge.changed(statement, then, now)


def loss_inputs(judge: Judge, inputs: LossInputsPayload | None, explained: set[Category]) -> bool:
    """True where a regression is stated in this run's loss-input-mismatch finding."""
    elsewhere = False
    then = {fact.function: fact for fact in reversed(judge.then.loss_inputs or [])}
    for fact in judge.now.loss_inputs or []:
        old = then.pop(fact.function, None)
        if old is None:
            continue
        judge.check.compared.append(f"the input of {fact.function}")
        statement = f"`{fact.function}` was given {old.kind} of shape {old.shape} ({old.dtype}) in the baseline and {fact.kind} of shape {fact.shape} ({fact.dtype}) now"
        wrong = WRONG_KINDS[fact.function]
        if old.kind not in wrong and fact.kind in wrong:
            if LOSS_INPUT_MISMATCH in explained:
                judge.check.regressions.append(statement + " (stated in the loss-input-mismatch finding)")
                elsewhere = True
                continue
            site = next((s.site for s in inputs.losses if s.function == fact.function and s.kind == fact.kind), None) if inputs is not None else None
            judge.found(f"loss-input-{fact.function}", statement, located.location(inputs, site, judge.fallback), {"baseline": old.model_dump(), "now": fact.model_dump()})
        elif (old.kind, old.shape[1:], old.dtype) != (fact.kind, fact.shape[1:], fact.dtype):
            judge.check.changed_not_worse.append(statement)
    return elsewhere


def modules(judge: Judge, explained: set[Category]) -> bool:
    """True where a module no optimizer holds now is stated in the unused-parameter finding.
    The modules that stopped changing are one finding (one cause: nothing trains)."""
    if not judge.then.copied or not judge.now.copied:
        return False
    now = {m.module: m.change for m in judge.now.modules}
    elsewhere, frozen = False, []
    for old in judge.then.modules:
        if old.change is None or old.change <= 0:
            continue
        name = f"module `{old.module}`" if old.module else "the root module's own parameters"
        judge.check.compared.append(f"the change of {name}")
        new = now.get(old.module)
        if old.module not in now:
            statement = f"{name} changed by {old.change:.3g} over the run in the baseline and is held by no optimizer now"
            if UNUSED_PARAMETER in explained:
                judge.check.regressions.append(statement + " (stated in the unused-parameter finding)")
                elsewhere = True
            else:
                judge.check.changed_not_worse.append(statement)
        elif new is not None:
            statement = f"{name} changed by {old.change:.3g} over the run in the baseline and by {new:.3g} now"
            if new < MODULE_KEPT * old.change:
                frozen.append((statement, old.module, old.change, new))
            else:
                judge.changed(statement, old.change, new)
    if frozen:
        data: dict[str, object] = {"modules": [{"module": m, "baseline_change": then, "change": change} for _, m, then, change in frozen]}
        judge.found("modules", "; ".join(s for s, *_ in frozen) + " (relative to its parameters)", judge.nearest(), data)
    return elsewhere


def evaluation(judge: Judge) -> None:
    then, now = judge.then.evaluation, judge.now.evaluation
    if then is None or now is None:
        return
    judge.check.compared.append("evaluation outputs for the same input")
    statement = (
        f"a model run twice under no_grad on the same input gave the same output in {then.deterministic} of {then.checked} checks "
        f"in the baseline and {now.deterministic} of {now.checked} now (in eval mode: {then.eval_mode} then, {now.eval_mode} now)"
    )
    if then.deterministic == then.checked and now.deterministic < now.checked:
        where = located.location(judge.payload, now.site, judge.fallback)
        judge.found("evaluation", statement, where, {"baseline": then.model_dump(), "now": now.model_dump()})
    elif (then.deterministic, then.eval_mode) != (now.deterministic, now.eval_mode):
        judge.check.changed_not_worse.append(statement)
