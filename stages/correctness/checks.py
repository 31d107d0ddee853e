"""The correctness checks that read the instrumented run: one object per check, each naming
the instruments whose payloads it decides from (`stages/agent/checks.py`). The stage lists them in
`CHECKS` (`stage.py`), in the order they run, beside `OWN_RUN_CHECKS`: the opt-in checks that
make runs of their own.

A check whose payload the run did not hand back finds nothing; the ones the stage's page shows
then record why they did not apply.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from traingate.pipeline.model.schema import Finding, Location
from traingate.stages.base import EntrypointRun, StageContext
from traingate.stages.agent.checks import Checked
from traingate.stages.correctness import baseline, clipping, discarded, ineffective, leakage, located, loss_inputs, mixing, modes, nonfinite, overfit, shuffling, stale, unused
from traingate.stages.correctness.details import TrainingFacts
from traingate.stages.correctness.probe.payloads import (
    CORRECTNESS_FACTS as FACTS,
    CORRECTNESS_GRADIENTS as GRADIENTS,
    CORRECTNESS_LOADERS as LOADERS,
    CORRECTNESS_LOSS_INPUTS as LOSS_INPUTS,
    CORRECTNESS_LOSSES as LOSSES,
    CORRECTNESS_MIXING as MIXING,
    CORRECTNESS_MODES as MODES,
    CORRECTNESS_STEPS as STEPS,
    FactsPayload,
    GradientsPayload,
    LoadersPayload,
    LossesPayload,
    LossInputsPayload,
    MixingPayload,
    ModesPayload,
    StepsPayload,
)


@dataclass
class InstrumentedRun:
    """What the checks of the instrumented run read: its payloads (None: the run ended before
    the instrument was installed, an import or setup failure), the line that steps most (where
    a finding without a line of its own is located), and what the checks before found."""

    ctx: StageContext
    run: EntrypointRun
    fallback: Location
    findings: list[Finding]

    @cached_property
    def steps(self) -> StepsPayload | None:
        return self.run.payload(STEPS, StepsPayload)

    @cached_property
    def losses(self) -> LossesPayload | None:
        return self.run.payload(LOSSES, LossesPayload)

    @cached_property
    def loaders(self) -> LoadersPayload | None:
        return self.run.payload(LOADERS, LoadersPayload)

    @cached_property
    def gradients(self) -> GradientsPayload | None:
        return self.run.payload(GRADIENTS, GradientsPayload)

    @cached_property
    def loss_inputs(self) -> LossInputsPayload | None:
        return self.run.payload(LOSS_INPUTS, LossInputsPayload)

    @cached_property
    def facts(self) -> FactsPayload | None:
        return self.run.payload(FACTS, FactsPayload)

    @cached_property
    def main_site(self) -> Location:
        return located.location(self.steps, located.main_step_site(self.steps), self.fallback)

    @cached_property
    def training_facts(self) -> TrainingFacts | None:
        """What the run's training was (steps, losses, records, modules), which a later run's
        baseline comparison reads; None without the facts payload."""
        payload = self.facts
        if payload is None:
            return None
        facts = TrainingFacts(
            steps=payload.steps, losses=list(overfit.step_losses(self.losses)[:500]), records=payload.records,
            copied=payload.copied, modules=payload.modules, matrices=payload.matrices,
        )
        baseline.add_observed(facts, payload, self.loaders, self.loss_inputs)
        return facts


class IneffectiveStep:
    """ineffective-step: optimizer steps after which no parameter of their groups changed, and why nothing moved."""

    name = "ineffective_step"
    reads = (STEPS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        steps = facts.steps
        return Checked(ineffective.ineffective_findings(facts.ctx, steps, facts.main_site) if steps is not None else [])


class UnusedParameter:
    """unused-parameter: trainable parameters no optimizer holds, and parameters of an optimizer group that never receive a gradient."""

    name = "unused_parameter"
    reads = (STEPS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        steps = facts.steps
        return Checked(unused.unused_findings(facts.ctx, steps, facts.main_site) if steps is not None else [])


class GradientClipping:
    """gradient-clipping: a clip whose gradients are not the ones the next optimizer step applies."""

    name = "gradient_clipping"
    reads = (STEPS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        steps = facts.steps
        return Checked(clipping.clipping_findings(facts.ctx, steps, facts.main_site) if steps is not None else [])


class NonFiniteLoss:
    """no-learning: the loss became NaN or inf during training (one the training recovers from is not reported)."""

    name = "non_finite"
    reads = (LOSSES, STEPS)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        losses = facts.losses
        return Checked(nonfinite.nonfinite_findings(facts.ctx, losses, facts.steps, facts.main_site) if losses is not None else [])


class UnshuffledTraining:
    """unshuffled-training: a DataLoader that drives optimizer steps never shuffles, or repeats one order every epoch."""

    name = "unshuffled_training"
    reads = (LOADERS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        loaders = facts.loaders
        return Checked(shuffling.shuffling_findings(facts.ctx, loaders, facts.main_site) if loaders is not None else [])


class DataLeakage:
    """data-leakage: an evaluation DataLoader handed out samples a training DataLoader also did."""

    name = "data_leakage"
    reads = (LOADERS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        loaders = facts.loaders
        return Checked(leakage.leakage_findings(facts.ctx, loaders, facts.main_site) if loaders is not None else [])


class StaleGradients:
    """stale-gradients: steps that applied gradient left over from before their previous step."""

    name = "stale_gradients"
    reads = (GRADIENTS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        found, record = stale.stale_gradient_check(facts.ctx, facts.gradients, facts.main_site)
        return Checked(found, record)


class DiscardedBackward:
    """grad-accumulation: backward passes whose gradients a `zero_grad()` cleared before any optimizer step used them."""

    name = "discarded_backward"
    reads = (GRADIENTS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        return Checked(discarded.discarded_findings(facts.ctx, facts.gradients, facts.main_site))


class TrainEvalMode:
    """train-eval-mode: optimizer steps taken with Dropout/BatchNorm in eval mode, and no_grad forwards with them in train mode."""

    name = "train_eval_mode"
    reads = (MODES,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        found, record = modes.mode_check(facts.ctx, facts.run.payload(MODES, ModesPayload), facts.main_site)
        return Checked(found, record)


class LossInputMismatch:
    """loss-input-mismatch: a classification loss given the wrong kind of input, judged on the inputs sampled at each loss call."""

    name = "loss_input_mismatch"
    reads = (LOSS_INPUTS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        found, record = loss_inputs.loss_input_check(facts.ctx, facts.loss_inputs, facts.main_site)
        return Checked(found, record)


class FrozenOutput:
    """unused-parameter: a frozen output layer whose output a loss reads (one finding per layer, naming every loss line)."""

    name = "frozen_output"
    reads = (LOSS_INPUTS,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        return Checked(unused.frozen_output_findings(facts.ctx, facts.loss_inputs, facts.main_site))


class BatchMixing:
    """batch-mixing: a sample's model output that depends on other samples of its batch, located at the first op mixing them."""

    name = "batch_mixing"
    reads = (MIXING,)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        found, record = mixing.mixing_check(facts.ctx, facts.run.payload(MIXING, MixingPayload), facts.main_site)
        return Checked(found, record)


class TrainingFactsRecord:
    """No finding of its own: what the run's training was, recorded for a later run's baseline comparison."""

    name = "training_facts"
    reads = (FACTS, LOSSES, LOADERS, LOSS_INPUTS)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        return Checked(record=facts.training_facts)


class TrainingRegression:
    """training-regression: the training facts against the baseline's; a fact a category found
    before it already states is not found again (a loss given the wrong input has its own finding)."""

    name = "baseline"
    reads = (FACTS, STEPS, LOSSES, LOADERS, LOSS_INPUTS)

    def evaluate(self, facts: InstrumentedRun) -> Checked:
        explained = {f.category for f in facts.findings}
        inputs = facts.loss_inputs
        executed = [site for p in (facts.steps, facts.losses, facts.loaders, inputs) if p is not None for site in p.sites]
        found, record = baseline.compare(facts.ctx, facts.training_facts, facts.facts, facts.fallback, explained, facts.loaders, inputs, executed)
        return Checked(found, record)

