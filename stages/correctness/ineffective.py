"""ineffective-step: optimizer steps after which no parameter of its groups changed, and
parameters that received gradients but never changed over the whole run."""

from __future__ import annotations

from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.contract.payloads.correctness import StepsPayload
from traingate.stages.correctness import located

CATEGORY = Category.INEFFECTIVE_STEP


def ineffective_findings(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    return _step_findings(ctx, steps, fallback) + _frozen_findings(ctx, steps, fallback)


def _lrs(lrs: list[float | None]) -> str:
    return ", ".join("?" if lr is None else f"{lr:g}" for lr in lrs)


def _step_findings(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    records = steps.ineffective
    if not records:
        return []
    first = records[0]
    total, count = steps.steps, steps.ineffective_count
    zero_lr = all(lr == 0 for lr in first.lrs if lr is not None) and any(lr is not None for lr in first.lrs)
    schedulers = [
        f"{s.class_} (built at {built.path}:{built.line})" if (built := located.site(steps, s.site)) else s.class_
        for s in first.schedulers
    ]
    schedule = f"the scheduler {', '.join(schedulers)}" if schedulers else "the schedule"
    cause = (
        f"the learning rate of every group was 0 at that step (lr = {_lrs(first.lrs)}), so {schedule} made the step a no-op"
        if zero_lr
        else (
            f"no parameter had a gradient ({first.grads_present} of {first.params} had one)"
            if first.grads_present == 0
            else f"the groups' learning rates were {_lrs(first.lrs)} and the gradients left every parameter as it was"
        )
    )
    where = located.code(steps, first.site)
    steps_listed = ", ".join(str(r.step) for r in records[:10]) + (", ..." if count > 10 else "")
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.HIGH,
            title=f"{count} of {total} optimizer step(s) changed no parameter (first: step {first.step}, lr = {_lrs(first.lrs)})",
            location=located.location(steps, first.site, fallback),
            problem=(
                f"After optimizer step {first.step} (optimizer {first.optimizer}, `{where or 'step()'}`) none of its {first.params} parameter(s) "
                f"changed: {cause}. Steps with no effect: {steps_listed}."
            ),
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"{count} of {total} step(s) left every parameter's sum, norm and sampled elements unchanged",
                data={"first": {**located.record(first), "site": site_record(located.site(steps, first.site)), "schedulers": schedulers}, "ineffective_steps": [r.step for r in records], "ineffective_count": count, "steps": total},
            ),
            key="steps",
        )
    ]


def _frozen_findings(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    frozen = steps.never_changed
    # Parameters of a step that never changed anything are already explained by that step.
    if not frozen or steps.ineffective_count >= steps.steps:
        return []
    first = frozen[0]
    count = steps.never_changed_count
    names = ", ".join(f"`{p.name or 'unnamed'}`" for p in frozen[:8]) + (", ..." if count > 8 else "")
    groups = sorted({(p.optimizer, p.group, p.lr) for p in frozen})
    group_text = "; ".join(f"optimizer {o}, group {g}: lr = {_lrs([lr])}" for o, g, lr in groups[:5])
    return [
        ctx.finding(
            category=CATEGORY,
            severity=Severity.HIGH,
            title=f"{count} parameter(s) in an optimizer group never changed over {steps.steps} steps, e.g. `{first.name or 'unnamed'}`",
            location=located.location(steps, first.site, fallback),
            problem=(
                f"{names} received gradients and belong to an optimizer group ({group_text}), yet none of them changed in any of the "
                f"{steps.steps} optimizer steps, while other parameters did."
            ),
            evidence=Evidence(
                kind=EvidenceKind.OBSERVED,
                summary=f"{count} parameter(s) unchanged after every step",
                data={"parameters": [{**located.record(p), "site": site_record(located.site(steps, p.site)), "root_site": site_record(located.site(steps, p.root_site))} for p in frozen[:50]], "count": count},
            ),
            key="never-changed:" + ",".join(sorted(str(p.name) for p in frozen[:20])),
        )
    ]
