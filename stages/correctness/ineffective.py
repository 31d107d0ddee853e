"""ineffective-step: optimizer steps after which no parameter of its groups changed, and
parameters that received gradients but never changed over the whole run."""

from __future__ import annotations

from typing import NamedTuple

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import IneffectiveStep, SchedulerRecord, StepsPayload
from traingate.stages.correctness import located, warmup
from traingate.stages.correctness.rules import INEFFECTIVE_STEP

CATEGORY = INEFFECTIVE_STEP


def ineffective_findings(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    return _step_findings(ctx, steps, fallback) + _frozen_findings(ctx, steps, fallback)


def _lrs(lrs: list[float | None]) -> str:
    return ", ".join("?" if lr is None else f"{lr:g}" for lr in lrs)


def _line(steps: StepsPayload, index: int | None) -> str:
    found = located.site(steps, index)
    return f"{found.path}:{found.line} (`{found.code}`)" if found else "a line outside the target"


def _step_findings(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    """One finding per cause the probes saw (the first step of each explains the rest)."""
    by_cause: dict[str | None, list[IneffectiveStep]] = {}
    for record in steps.ineffective:
        by_cause.setdefault(record.cause, []).append(record)
    # Exact when every ineffective step was kept (MAX_STEP_RECORDS); past it, the one cause takes the whole count.
    whole = len(by_cause) == 1 or len(steps.ineffective) == steps.ineffective_count
    return [
        _warmup_finding(ctx, steps, records, fallback)
        if warmup.first_steps_only(steps, records)
        else _step_finding(ctx, steps, records, steps.ineffective_count if len(by_cause) == 1 else len(records), fallback, exact=whole)
        for records in by_cause.values()
    ]


def _schedule_location(ctx: StageContext, steps: StepsPayload, first: IneffectiveStep) -> Location | None:
    """Where the schedule that gave lr 0 is: its scheduler's construction, else the loop's own
    `group["lr"] = ...` before the step."""
    for scheduler in first.schedulers:
        built = located.location(steps, scheduler.site, Location(path=""))
        if built.path:
            return built
    step = located.site(steps, first.site)
    return warmup.lr_assignment(ctx.root, step.path, step.line) if step is not None else None


def _warmup_finding(ctx: StageContext, steps: StepsPayload, records: list[IneffectiveStep], fallback: Location) -> Finding:
    """Only each optimizer's first step had lr 0, and later steps trained: a warm-up that starts
    at 0 by design wastes that one step. Low; more such steps are the high finding."""
    first = records[0]
    schedulers = [_scheduler(steps, s) for s in first.schedulers]
    at = _schedule_location(ctx, steps, first)
    if schedulers:
        schedule = f"the scheduler {', '.join(schedulers)}"
    else:
        schedule = f"the loop's own `lr` assignment at {at.path}:{at.line}" if at is not None else "the group settings"
    where = located.code(steps, first.site)
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.LOW,
        title=f"The warm-up starts at lr 0: the first optimizer step changed no parameter ({len(records)} of {steps.steps} steps), set by {schedule}",
        location=at or located.location(steps, first.site, fallback),
        problem=(
            f"At optimizer step {first.step} (optimizer {first.optimizer}, `{where or 'step()'}`) the learning rate of every group was 0 (lr = {_lrs(first.lrs)}), "
            f"set by {schedule}, so none of its {first.params} parameter(s) changed. Only the optimizer's first step had a rate of 0 and every later step trained: "
            "a warm-up that starts at 0 wastes that one step by design. Steps with nothing applied beyond the warm-up's first step would block."
        ),
        impact="One step's forward and backward pass teaches the model nothing; the rest of the training is unaffected.",
        fix="Start the warm-up above 0 (e.g. lr * (step + 1) / warmup) to use the first step, or leave it: one step is a small waste.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{len(records)} of {steps.steps} step(s), each optimizer's first, ran with lr 0 and left every parameter unchanged",
            data={
                "cause": first.cause,
                "warmup_first_step": True,
                "first": {**located.record(first), "site": site_record(located.site(steps, first.site)), "schedulers": schedulers},
                "schedule_site": at.model_dump(mode="json") if at is not None else None,
                "ineffective_steps": [r.step for r in records],
                "ineffective_count": len(records),
                "steps": steps.steps,
            },
        ),
        key="steps:zero-lr",
    )


def _step_finding(ctx: StageContext, steps: StepsPayload, records: list[IneffectiveStep], count: int, fallback: Location, *, exact: bool) -> Finding:
    first, total = records[0], steps.steps
    schedulers = [_scheduler(steps, s) for s in first.schedulers]
    cause = _cause(steps, first, schedulers)
    where = located.code(steps, first.site)
    steps_listed = ", ".join(str(r.step) for r in records[:10]) + (", ..." if count > 10 else "")
    at = first.clear_site if first.cause == "cleared" and first.clear_site is not None else first.site
    return ctx.finding(
        category=CATEGORY,
        severity=Severity.HIGH,
        title=f"{count} of {total} optimizer step(s) changed no parameter: {cause.short}",
        location=located.location(steps, at, fallback),
        problem=(
            f"After optimizer step {first.step} (optimizer {first.optimizer}, `{where or 'step()'}`) none of its {first.params} parameter(s) "
            f"changed: {cause.observed}. Steps with no effect{'' if exact else ' for this cause'}: {steps_listed}."
        ),
        impact=f"{cause.impact} The step costs a forward and backward pass and teaches the model nothing.",
        fix=cause.fix,
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{count} of {total} step(s) left every parameter's sum, norm and sampled elements unchanged, fingerprinted right before and right after each step",
            data={
                "cause": first.cause,
                "first": {**located.record(first), "site": site_record(located.site(steps, first.site)), "schedulers": schedulers},
                "backward_site": site_record(located.site(steps, first.backward_site)),
                "clear_site": site_record(located.site(steps, first.clear_site)),
                "ineffective_steps": [r.step for r in records],
                "ineffective_count": count,
                "steps": total,
            },
        ),
        key=f"steps:{first.cause}" if first.cause else "steps",
    )


def _scheduler(steps: StepsPayload, scheduler: SchedulerRecord) -> str:
    """`LambdaLR (built at train.py:9, last stepped at train.py:14)`, as far as it is known."""
    built, stepped = located.site(steps, scheduler.site), located.site(steps, scheduler.step_site)
    where = [f"built at {built.path}:{built.line}"] if built else []
    if stepped is not None and scheduler.step_site != scheduler.site:
        where.append(f"last stepped at {stepped.path}:{stepped.line}")
    return f"{scheduler.class_} ({', '.join(where)})" if where else scheduler.class_


class _Cause(NamedTuple):
    short: str  # for the title
    observed: str  # what the probes saw
    impact: str
    fix: str


def _cause(steps: StepsPayload, first: IneffectiveStep, schedulers: list[str]) -> _Cause:
    lrs = _lrs(first.lrs)
    backward = _line(steps, first.backward_site)
    if first.cause == "frozen":
        names = ", ".join(f"`{n or 'unnamed'}`" for n in first.frozen or []) + (", ..." if first.params > len(first.frozen or []) else "")
        return _Cause(
            f"every parameter it holds is frozen (requires_grad=False), e.g. `{(first.frozen or [None])[0] or 'unnamed'}`",
            f"every one of its {first.params} parameter(s) has requires_grad=False ({names}), so none receives a gradient",
            "Nothing the optimizer holds can train.",
            "Set requires_grad=True on the parameters meant to train (a fine-tuned head, the layers you unfroze), "
            "or build the optimizer from the trainable ones only (`[p for p in model.parameters() if p.requires_grad]`).",
        )
    if first.cause == "zero-lr" or (first.cause is None and first.lrs and all(lr == 0 for lr in first.lrs if lr is not None) and any(lr is not None for lr in first.lrs)):
        schedule = f"the scheduler {', '.join(schedulers)}" if schedulers else "the group settings"
        return _Cause(
            f"the learning rate was 0 (lr = {lrs})",
            f"the learning rate of every group was 0 at that step (lr = {lrs}), set by {schedule}",
            "A rate of 0 makes the step a no-op.",
            "Make the schedule give a rate above 0 at the step shown (a warm-up should start above 0, e.g. lr * (step + 1) / warmup), "
            "or fix the group's lr.",
        )
    if first.cause == "cleared":
        kept = f"the {first.grads_after_backward} gradient(s) " if first.grads_after_backward else "the gradients "
        if first.clear_site is not None:
            how = f"`{first.clear_call or 'zero_grad'}()` at {_line(steps, first.clear_site)} cleared them after the backward at {backward} and before the step"
        else:
            how = f"they were gone or zero at the step, though no `zero_grad()` over these parameters ran after the backward at {backward} (set to None or zeroed directly)"
        return _Cause(
            "the gradients were cleared between the backward and the step" + (f" at {_short(steps, first.clear_site)}" if first.clear_site is not None else ""),
            f"{kept}the backward left were cleared before the step used them: {how}",
            "No step applies a gradient.",
            "Clear the gradients before the backward (at the start of the iteration, or right after `step()`), never between `backward()` and `step()`.",
        )
    if first.cause == "no-gradient":
        return _Cause(
            "no parameter received a gradient (the loss does not reach them)",
            f"the backward at {backward} left none of the optimizer's {first.params} parameter(s) with a gradient: the loss it ran on does not depend on them",
            "The loss is cut off from the parameters the optimizer holds.",
            "Find the cut between these parameters and the loss (a `detach()`, a `torch.no_grad()` block around the forward, a branch whose output the loss does not use, "
            "or an optimizer built over another model's parameters) and remove it.",
        )
    if first.cause == "no-backward":
        return _Cause(
            "no backward ran since the previous step",
            f"no backward call ran since this optimizer's previous step ({first.grads_present} of {first.params} parameter(s) held a gradient)",
            "The step has no new gradient to apply.",
            "Call `loss.backward()` before every `optimizer.step()`.",
        )
    return _Cause(
        f"lr = {lrs}",
        f"the groups' learning rates were {lrs}, {first.grads_present} of {first.params} parameter(s) held a gradient, and the update left every parameter as it was",
        "The update is too small to change any parameter in its precision, or the optimizer skipped it.",
        "Check the learning rate and the gradients' scale at the step shown.",
    )


def _short(steps: StepsPayload, index: int | None) -> str:
    found = located.site(steps, index)
    return f"{found.path}:{found.line}" if found else "a line outside the target"


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
