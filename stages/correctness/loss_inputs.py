"""loss-input-mismatch: a classification loss given the wrong kind of input, judged on the
inputs sampled at each loss call (`probe.loss_inputs`)."""

from __future__ import annotations

from dataclasses import dataclass
from traingate.stages.correctness.details import LossInputsCheck, LossInputsNotApplicable, LossLine
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import LossInputSite, LossInputsPayload, LossShapeSite
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import LOSS_INPUT_MISMATCH

CATEGORY = LOSS_INPUT_MISMATCH
NOT_APPLICABLE = (
    "not applicable: no cross_entropy, nll_loss, binary_cross_entropy_with_logits, mse_loss, l1_loss, smooth_l1_loss, huber_loss "
    "or binary_cross_entropy call (nor their nn loss modules), nor any torch.distributions log_prob, was observed"
)
_SQUASHED = {"SoftmaxBackward0": "softmax", "LogSoftmaxBackward0": "log_softmax", "SigmoidBackward0": "sigmoid"}


@dataclass(frozen=True)
class _Mismatch:
    given: str  # what the loss was given, in words
    expected: str
    severity: Severity
    why: str  # what it does to the loss


def _mismatch(loss: LossInputSite) -> _Mismatch | None:
    function, kind = loss.function, loss.kind
    training = loss.gradients_recorded
    severe = Severity.HIGH if training else Severity.MEDIUM
    if function == "cross_entropy" and kind == "probabilities":
        return _Mismatch("probabilities (non-negative rows summing to 1)", "raw logits", severe, "cross_entropy applies log-softmax itself: on probabilities in [0, 1] the loss barely depends on the model's output and the gradients shrink")
    if function == "cross_entropy" and kind == "log-probabilities":
        return _Mismatch("log-probabilities (rows whose exp sums to 1)", "raw logits", Severity.LOW, "log-softmax runs twice; log-softmax of log-probabilities is themselves, so the loss is the same and the extra op is only redundant")
    if function == "nll_loss" and kind in ("logits", "probabilities"):
        given = "raw logits (rows whose exp sums to more than 1, which no log-probabilities do)" if kind == "logits" else "probabilities (non-negative rows summing to 1)"
        return _Mismatch(given, "log-probabilities (`log_softmax` of the logits)", severe, "nll_loss only picks minus the target's entry: on these inputs that is not a likelihood, it is unbounded below and training pushes the target's value up instead of normalising")
    if function == "binary_cross_entropy_with_logits" and kind == "unit-interval":
        sigmoid = loss.producer == "SigmoidBackward0" or loss.module == "Sigmoid"
        return _Mismatch(
            "sigmoid outputs (every value in [0, 1]" + (", made by a sigmoid)" if sigmoid else "; no sigmoid was seen making them)"),
            "raw logits", severe if sigmoid else Severity.MEDIUM,
            "the loss applies the sigmoid again, so the predicted probability stays between 0.5 and 0.73 and the gradients shrink",
        )
    return None


def loss_input_check(ctx: StageContext, data: LossInputsPayload | None, fallback: Location) -> tuple[list[Finding], LossInputsCheck | LossInputsNotApplicable]:
    """The findings, one per loss line given the wrong input, and the check's record (not
    applicable without the payload: the run handed back none)."""
    if data is None or not (data.losses or data.shape_calls):
        return [], LossInputsNotApplicable(ran=False, applicable=False, note=NOT_APPLICABLE, calls=data.calls if data is not None else 0)
    losses = data.losses
    judged = [(loss, _mismatch(loss)) for loss in losses]
    findings = [_finding(ctx, data, loss, mismatch, fallback) for loss, mismatch in judged if mismatch is not None]
    shaped = [_shape_finding(ctx, data, shape, fallback) for shape in data.shapes]
    record = LossInputsCheck(
        ran=True,
        applicable=True,
        calls=data.calls,
        lines=[LossLine(function=loss.function, site=located.site(data, loss.site), kind=loss.kind, sampled=loss.sampled, rows=loss.rows) for loss in losses],
        mismatches=len(findings),
    )
    if data.shape_calls:  # set only where an element-wise loss ran: older records stay as they were
        record.shape_calls, record.shape_mismatches = data.shape_calls, len(shaped)
    return findings + shaped, record


def _shape_finding(ctx: StageContext, data: LossInputsPayload, shape: LossShapeSite, fallback: Location) -> Finding:
    found = located.site(data, shape.site)
    line = f"{found.path}:{found.line} (`{found.code}`)" if found else "a line outside the target"
    given, target, broadcast = (tuple(s) for s in (shape.input_shape, shape.target_shape, shape.broadcast_shape))
    if shape.distribution:
        function = f"{shape.distribution}.log_prob"
        compared = f"a distribution of batch shape {given} with values of shape {target}"
        fix = "Give the values the distribution's batch shape: `dist.log_prob(y.squeeze(-1))`, or build the distribution from a mean of the values' shape."
    else:
        function, compared = shape.function, f"an input of shape {given} with a target of shape {target}"
        fix = "Give the input and the target the same shape: squeeze the prediction's trailing dimension (`pred.squeeze(-1)`) or reshape the target (`y.view_as(pred)`)."
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH if shape.gradients_recorded else Severity.MEDIUM,
        title=f"`{function}` compared {compared}: broadcast to {broadcast}",
        location=located.location(data, shape.site, fallback),
        problem=(
            f"The call at {line} gave `{function}` {compared}, which broadcast to {broadcast}: "
            f"every prediction is compared with every target it lines up with, not its own, so the loss trains each prediction towards the targets' mean. "
            f"Seen on {shape.mismatched} of the {shape.calls} call(s) from that line"
            + ("" if shape.gradients_recorded else "; these calls recorded no gradients (a validation loss): its metric is wrong, the training is not")
            + "."
        ),
        fix=fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{shape.mismatched} call(s) of {function} with shapes {given} and {target}",
            data={
                "rule": "shape",
                "function": function,
                "input_shape": shape.input_shape,
                "target_shape": shape.target_shape,
                "broadcast_shape": shape.broadcast_shape,
                "calls": shape.calls,
                "mismatched_calls": shape.mismatched,
                "gradients_recorded": shape.gradients_recorded,
            },
        ),
        key=f"shape:{function}:{given}:{target}",
    )


def _producer(data: LossInputsPayload, loss: LossInputSite) -> str:
    if loss.module:
        found = located.site(data, loss.module_site)
        where = f", called at {found.path}:{found.line} (`{found.code}`)" if found else ""
        return f"the output of a `{loss.module}` module{where}"
    if loss.producer in _SQUASHED:
        found = located.site(data, loss.producer_site)
        where = f" called at {found.path}:{found.line} (`{found.code}`)" if found else ""
        return f"the output of `{_SQUASHED[loss.producer]}`{where}"
    return f"the output of `{loss.producer}`" if loss.producer else "a tensor whose producer was not seen"


def _finding(ctx: StageContext, data: LossInputsPayload, loss: LossInputSite, mismatch: _Mismatch, fallback: Location) -> Finding:
    found = located.site(data, loss.site)
    line = f"{found.path}:{found.line} (`{found.code}`)" if found else "a line outside the target"
    producer = _producer(data, loss)
    return ctx.finding(
        category=CATEGORY,
        severity=mismatch.severity,
        title=f"`{loss.function}` was given {mismatch.given.split(' (')[0]}, not {mismatch.expected.split(' (')[0]}: {producer}",
        location=located.location(data, loss.site, fallback),
        problem=(
            f"The call at {line} gave `{loss.function}` {mismatch.given}: {producer}. It expects {mismatch.expected}; {mismatch.why}. "
            f"Seen on every sampled call ({loss.sampled} of {loss.calls}, {loss.rows} rows)"
            + ("" if loss.gradients_recorded else "; these calls recorded no gradients (a validation loss): its metric is wrong, the training is not")
            + "."
        ),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{loss.sampled} sampled call(s) of {loss.function} given {loss.kind}",
            data={
                "function": loss.function,
                "input_kind": loss.kind,
                "calls": loss.calls,
                "sampled_calls": loss.sampled,
                "rows": loss.rows,
                "producer": loss.producer,
                "module": loss.module,
                "module_site": site_record(located.site(data, loss.module_site)),
                "producer_site": site_record(located.site(data, loss.producer_site)),
                "gradients_recorded": loss.gradients_recorded,
                "example": loss.example,
            },
        ),
        key=f"{loss.function}:{loss.kind}",
    )
