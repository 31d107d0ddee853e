"""batch-mixing: a sample's model output that depends on other samples of its batch, charted
with gradients on a batch the run used and located at the first op mixing them (`probe.mixing`)."""

from __future__ import annotations

from traingate.stages.correctness.details import MixingCheck, NotApplicable
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import MixingPayload, SampleDependency, TracedOp
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import BATCH_MIXING

CATEGORY = BATCH_MIXING


def mixing_check(ctx: StageContext, data: MixingPayload | None, fallback: Location) -> tuple[list[Finding], MixingCheck | NotApplicable]:
    """The finding when some sample's outputs depend on another sample, and the check's record
    (not applicable without the payload: the run handed back none)."""
    if data is None or not data.applicable:
        return [], NotApplicable(ran=False, applicable=False, note=f"not applicable: {(data.reason if data is not None else None) or 'nothing was captured'}")
    mixed = [s for s in data.samples if s.others_count]
    record = MixingCheck(
        ran=True,
        applicable=True,
        model=data.model,
        batch_size=data.batch_size,
        batch_dim=data.batch_dim,
        batch_dim_assumed=data.batch_dim_assumed,
        samples_judged=[s.sample for s in data.samples],
        mixed=bool(mixed),
        site=located.site(data, data.site),
    )
    if not mixed:
        return [], record
    return [_finding(ctx, data, mixed, fallback)], record


def _op(data: MixingPayload, op: TracedOp | None) -> str:
    if op is None:
        return ""
    found = located.site(data, op.site)
    where = f" at {found.path}:{found.line} (`{found.code}`)" if found else ""
    return f"`{op.name}`{where}, output shape {tuple(op.shape)}"


def _severity(data: MixingPayload) -> tuple[Severity, str]:
    if data.batch_dim_assumed:
        return Severity.MEDIUM, " No DataLoader said how many samples the batch has, so dim 0 was taken for the batch: medium, not blocking."
    if data.pairwise_output:
        return Severity.MEDIUM, " An output has two dimensions of the batch's size (pairwise scores, as in contrastive models, mix samples by design): medium, not blocking."
    return Severity.HIGH, ""


def _finding(ctx: StageContext, data: MixingPayload, mixed: list[SampleDependency], fallback: Location) -> Finding:
    mixing, layout = data.mixing_op, data.layout_op
    location = located.location(data, mixing.site if mixing else data.site, fallback)
    model = f"`{data.model}`"
    first = mixed[0]
    others = ", ".join(str(j) for j in first.others) + (", ..." if first.others_count > len(first.others) else "")
    severity, caveat = _severity(data)
    pair = data.pair or []  # the two samples the located op mixes: given with `mixing_op`
    where = (
        f" The samples first mix in {_op(data, mixing)}: its output holds values computed from both sample {pair[0]} and sample {pair[1]}."
        if mixing
        else f" The op where they first mix was not found ({data.locate_error or 'the NaN runs did not show it'}); it is located at the model's call."
    )
    laid_out = f" Before it, {_op(data, layout)} spread each sample over several indexes of every dimension of size {data.batch_size}: a `view`/`reshape` where `transpose`/`permute` was meant?" if layout else ""
    return ctx.finding(
        category=CATEGORY,
        severity=severity,
        title=f"{model}'s output for sample {first.sample} depends on {first.others_count} other sample(s) of its batch" + (f": they mix at `{mixing.name}`" if mixing else ""),
        location=location,
        problem=(
            f"On the run's first training batch ({data.batch_size} samples along dim {data.batch_dim}), with {model} in eval mode, the gradient of sample {first.sample}'s outputs "
            f"with respect to the input of sample(s) {others} is not zero (largest {first.largest_other_gradient:.3g}, against {first.own_gradient:.3g} for its own input)."
            + where + laid_out + caveat
        ),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"nonzero gradient across samples: sample {first.sample} depends on {first.others_count} other(s)",
            data={
                "model": data.model,
                "model_site": site_record(located.site(data, data.site)),
                "batch_size": data.batch_size,
                "batch_dim": data.batch_dim,
                "batch_dim_assumed": data.batch_dim_assumed,
                "pairwise_output": data.pairwise_output,
                "dependencies": [located.record(s) for s in data.samples],
                "mixing_op": {**located.record(mixing), "site": site_record(located.site(data, mixing.site))} if mixing else None,
                "layout_op": {**located.record(layout), "site": site_record(located.site(data, layout.site))} if layout else None,
                "ops_traced": data.ops_traced,
            },
        ),
        key=f"{data.model}:{mixing.name if mixing else ''}",
    )
