"""unused-parameter: trainable model parameters no optimizer holds, and parameters in an
optimizer group that never receive a gradient."""

from __future__ import annotations

from collections.abc import Sequence

from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import FrozenOutput, GroupParameter, LossInputsPayload, ParameterDescription, StepsPayload
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import UNUSED_PARAMETER

CATEGORY = UNUSED_PARAMETER


def unused_findings(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    if not steps.steps:
        return []
    findings = _not_in_optimizer(ctx, steps, fallback)
    # Every step changed nothing: `ineffective-step` says why no parameter had a gradient.
    if steps.ineffective_count >= steps.steps:
        return findings
    return findings + _without_gradient(ctx, steps, fallback)


def _not_in_optimizer(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    """Parameters that received gradients but that no optimizer holds: one finding for all."""
    outside = steps.not_in_optimizer
    if not outside:
        return []
    built = _optimizer_site(steps, outside)
    left_out = f" The optimizer built at {_line(steps, built)} left them out." if built is not None else ""
    return [
        _finding(
            ctx, steps, outside, steps.not_in_optimizer_count, fallback,
            reason="not-in-optimizer",
            title="{count} trainable parameter(s) received gradients but are in no optimizer group, e.g. `{name}`"
            + (f": the optimizer built at {_short(steps, built)} left them out" if built is not None else ""),
            problem=(
                "{names} have requires_grad=True and received gradients during training, but no optimizer that stepped holds them "
                "({optimizers}): they keep their initial values." + left_out + " Their module was built at {site}."
            ),
            at=built,
        )
    ]


def _without_gradient(ctx: StageContext, steps: StepsPayload, fallback: Location) -> list[Finding]:
    """Parameters of an optimizer group that never received a gradient, one finding per why:
    their module's output was cut from the loss, reaches no loss, or the module never ran."""
    findings = []
    ran = [p for p in steps.no_gradient if p.forward_ran is not False]
    # Watched after a step found them without a gradient: ran with gradients recorded and met no cut.
    unreached = [p for p in ran if p.watched_forward and p.cut is None]
    # A cut blocks only where one was seen (a detach, `.data`, a no_grad forward at its line).
    cut = [p for p in ran if p.cut is not None]
    unseen = [p for p in ran if p not in unreached and p.cut is None]
    if cut:
        findings.append(_cut_finding(ctx, steps, cut, len(cut) if len(cut) < len(steps.no_gradient) else steps.no_gradient_count, fallback))
    if unseen:
        findings.append(_not_reached_finding(ctx, steps, unseen, fallback))
    if unreached:
        findings.append(
            _finding(
                ctx, steps, unreached, len(unreached), fallback,
                reason="output-unused",
                severity=Severity.MEDIUM,
                title="{count} parameter(s) in an optimizer group belong to a module whose output reaches no loss, e.g. `{name}`",
                problem=(
                    "{names} are in an optimizer group ({optimizers}) and their module ran its forward with gradients recorded, but their `.grad` was None at every one "
                    f"of the {steps.steps} optimizer steps, and no `detach()`, `.data` or `torch.no_grad()` cut its output from a loss: its output reaches no loss "
                    "(a head computed and left unused, as a self-supervised method does with a classification head it trains later). Their module was built at {site}."
                ),
                impact="The optimizer carries parameters no loss uses: harmless to training, but weight decay still moves them, and a head meant to train stays at its initialisation.",
                fix="If the loss should use this output, feed it to the loss; otherwise leave the module out of the optimizer (or skip its forward).",
            )
        )
    never_called = [p for p in steps.no_gradient if p.forward_ran is False]
    if never_called:
        findings.append(
            _finding(
                ctx, steps, never_called, len(never_called), fallback,
                reason="never-called",
                severity=Severity.MEDIUM,
                title="{count} parameter(s) in an optimizer group belong to a module that never ran, e.g. `{name}`",
                problem=(
                    "{names} are in an optimizer group ({optimizers}) but the module holding them never ran a forward in the "
                    f"{steps.steps} optimizer steps: its output reaches no loss (an unused head left in the optimizer). Their module was built at {{site}}."
                ),
                impact="The optimizer carries parameters nothing uses: harmless to training, but weight decay still moves them, and a head meant to train stays at its initialisation.",
                fix="Leave the unused module out of the optimizer (or delete it); if the loss should use it, call it in the forward.",
            )
        )
    return findings


def _not_reached_finding(ctx: StageContext, steps: StepsPayload, unseen: list[GroupParameter], fallback: Location) -> Finding:
    """Medium: no gradient, and no cut seen; the run's data may not take the path that uses them."""
    return _finding(
        ctx, steps, unseen, len(unseen), fallback,
        reason="not-reached",
        severity=Severity.MEDIUM,
        title="{count} parameter(s) in an optimizer group got no gradient in this run, and no cut was seen, e.g. `{name}`",
        problem=(
            "{names} are in an optimizer group ({optimizers}) and their module ran, but their `.grad` was None at every one of the "
            f"{steps.steps} optimizer steps, and no `detach()`, `.data` or `torch.no_grad()` was seen cutting them from a loss: the run's own "
            "data may never take the path that uses them (a parameter used only for inputs of another kind, as a scale used only for "
            "continuous columns when the data has none). Their module was built at {site}."
        ),
        impact="With other data they may train; with this data they stay at their initialisation, and weight decay still moves them.",
        fix="If the data that uses them is part of the task, make the configured run's data reach them; otherwise nothing to change.",
    )


_CUTS = {"detach": "`detach()`", "data": "`.data`", "no_grad": "a forward under `torch.no_grad()`"}


def _cut_finding(ctx: StageContext, steps: StepsPayload, cut: list[GroupParameter], count: int, fallback: Location) -> Finding:
    """High: the module ran, and its output was cut from the loss (at the line seen, where one was)."""
    seen = next((p for p in cut if p.cut is not None), None)
    if seen is not None and seen.cut is not None:
        how = f": {_CUTS[seen.cut]} at {_line(steps, seen.cut_site)} cut `{_qualified(seen)}`'s output from the loss"
    else:
        how = " (a dead branch, `detach()`, or `torch.no_grad()` around part of the forward)"
    return _finding(
        ctx, steps, cut, count, fallback,
        reason="no-gradient",
        title="{count} parameter(s) in an optimizer group never received a gradient, e.g. `{name}`"
        + (f": cut by {_CUTS[seen.cut]} at {_short(steps, seen.cut_site)}" if seen is not None and seen.cut is not None else ""),
        problem=(
            "{names} are in an optimizer group ({optimizers}) and their module ran its forward, but their `.grad` was None at every one of the "
            f"{steps.steps} optimizer steps: the gradient is cut between them and the loss{how}. Their module was built at {{site}}."
        ),
        at=seen.cut_site if seen is not None else None,
    )


def _finding(
    ctx: StageContext, steps: StepsPayload, params: Sequence[ParameterDescription], count: int, fallback: Location, *, reason: str, title: str, problem: str,
    severity: Severity = Severity.HIGH, impact: str | None = None, fix: str | None = None, at: int | None = None,
) -> Finding:
    """`at`: the line the finding points at, where it is not the first parameter's module (the
    optimizer construction that left the parameters out)."""
    first = params[0]
    name = _qualified(first)
    names = ", ".join(f"`{_qualified(p)}`" + (f" (of {p.root})" if p.root else "") for p in params[:8]) + (", ..." if count > 8 else "")
    where = located.site(steps, first.site)
    site_text = f"{where.path}:{where.line} (`{where.code}`)" if where else "an unknown line"
    optimizers = ", ".join(f"{o.class_} with {sum(g.params for g in o.groups)} parameter(s)" for o in steps.optimizers) or "none"
    return ctx.finding(
        category=CATEGORY,
        severity=severity,
        impact=impact,
        fix=fix,
        title=title.format(count=count, name=name),
        location=located.location(steps, at if at is not None else first.site, fallback),
        problem=problem.format(names=names, optimizers=optimizers, site=site_text),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{count} parameter(s): {reason}",
            data={
                "reason": reason,
                "parameters": [
                    {
                        **located.record(p), "qualified_name": _qualified(p), "site": site_record(located.site(steps, p.site)), "root_site": site_record(located.site(steps, p.root_site)),
                        **({"cut_site": site_record(located.site(steps, p.cut_site))} if isinstance(p, GroupParameter) and p.cut_site is not None else {}),
                    }
                    for p in params[:50]
                ],
                "count": count,
                "optimizers": [{**located.record(o), "site": site_record(located.site(steps, o.site))} for o in steps.optimizers],
            },
        ),
        key=f"{reason}:" + ",".join(sorted(_qualified(p) for p in params[:20])),
    )


def _optimizer_site(steps: StepsPayload, outside: list[ParameterDescription]) -> int | None:
    """The line that built the optimizer that left `outside` out: the one line all the
    optimizers were built at; else, of several (a dict of optimizers, one per sub-model), the
    one whose parameters sit nearest the left-out ones in their model (`vae.encoder` is
    `vae.decoder`'s sibling; a discriminator's optimizer shares nothing with them)."""
    built = {o.site for o in steps.optimizers}
    if len(built) == 1:
        return built.pop()
    scores = [(max((_shared(module, p) for module in o.modules for p in outside), default=0), o.site) for o in steps.optimizers if o.site is not None]
    ranked = sorted(scores, key=lambda item: -item[0])
    if not ranked or ranked[0][0] == 0 or (len(ranked) > 1 and ranked[1][0] == ranked[0][0] and ranked[1][1] != ranked[0][1]):
        return None  # no optimizer, or two equally near: none is named
    return ranked[0][1]


def _shared(module: str, param: ParameterDescription) -> int:
    """How many leading module names `module` (`Root:vae.encoder.0`) shares with `param`'s, in
    the same root model; 0 in another (1 for the root itself, so that a sibling at the top counts)."""
    root, _, path = module.partition(":")
    if param.root is None or param.name is None or root != param.root:
        return 0
    mine, theirs = path.split(".") if path else [], param.name.split(".")[:-1]
    shared = next((i for i, (a, b) in enumerate(zip(mine, theirs, strict=False)) if a != b), min(len(mine), len(theirs)))
    return 1 + shared


def _short(steps: StepsPayload, index: int | None) -> str:
    found = located.site(steps, index)
    return f"{found.path}:{found.line}" if found else "a line outside the target"


def _qualified(param: ParameterDescription) -> str:
    """The parameter's qualified name in its root module (`encoder.layers.3.attn.proj.weight`)."""
    if not param.name:
        return f"<unnamed parameter of shape {tuple(param.shape)}>"
    return param.name


def frozen_output_findings(ctx: StageContext, data: LossInputsPayload | None, fallback: Location) -> list[Finding]:
    """The frozen-output rule: one finding per frozen output layer (`probe.frozen_output`), naming
    every loss line given its output (a training and a validation loss are one cause)."""
    if data is None:
        return []
    by_layer: dict[tuple[str, int | None], list[FrozenOutput]] = {}
    for record in data.frozen_outputs:
        by_layer.setdefault((record.module, record.module_site), []).append(record)
    return [_frozen_output(ctx, data, records, fallback) for records in by_layer.values()]


def _line(data: located.Sited, index: int | None) -> str:
    found = located.site(data, index)
    return f"{found.path}:{found.line} (`{found.code}`)" if found else "a line outside the target"


def _frozen_output(ctx: StageContext, data: LossInputsPayload, records: list[FrozenOutput], fallback: Location) -> Finding:
    record = records[0]
    losses = " and ".join(f"`{r.function}` at {_line(data, r.site)}" for r in records)
    froze = f"; the line {_line(data, record.frozen_site)} froze it" if record.frozen_site is not None else ""
    return ctx.finding(
        category=CATEGORY,
        rule=f"{CATEGORY.value}/frozen-output",
        title=f"The output layer `{record.module}` built at {_line(data, record.module_site).split(' (')[0]} is frozen: the loss trains everything but it",
        location=located.location(data, record.frozen_site if record.frozen_site is not None else record.module_site, fallback),
        problem=(
            f"The loss{'' if len(records) == 1 else 'es'} {losses} {'is' if len(records) == 1 else 'are'} given the output of the `{record.module}` built at {_line(data, record.module_site)}, "
            f"whose {record.params} parameter(s) all have requires_grad=False{froze}, while other parameters train. The layer was built by the target and no checkpoint was loaded into it: "
            "it stays at its random initialisation."
        ),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"the layer behind the input of {record.function} has no parameter that trains",
            data={
                "reason": "frozen-output",
                "module": record.module,
                "module_site": site_record(located.site(data, record.module_site)),
                "frozen_site": site_record(located.site(data, record.frozen_site)),
                "loss_site": site_record(located.site(data, record.site)),
                "loss_sites": [site_record(located.site(data, r.site)) for r in records],
                "function": record.function,
                "params": record.params,
            },
        ),
        key=f"frozen-output:{record.module}:{record.module_site}",
    )
