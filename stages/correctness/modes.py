"""train-eval-mode: optimizer steps taken with Dropout/BatchNorm left in eval mode, and forward
passes under no_grad/inference_mode with them in train mode (`probe.modes`)."""

from __future__ import annotations

from traingate.stages.correctness.details import ModesCheck, NotApplicable
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import StageContext, site_record
from traingate.stages.correctness.probe.payloads import EvalWhileTraining, FunctionalDropout, ModeModule, ModesPayload, TrainUnderNoGrad
from traingate.stages.correctness import located
from traingate.stages.correctness.rules import TRAIN_EVAL_MODE

CATEGORY = TRAIN_EVAL_MODE
NOT_APPLICABLE = "not applicable: no Dropout (p > 0), MultiheadAttention with dropout, BatchNorm or other norm layer that tracks running statistics ran a forward"


def mode_check(ctx: StageContext, modes: ModesPayload | None, fallback: Location) -> tuple[list[Finding], ModesCheck | NotApplicable]:
    """The findings, one per line that called the model in the wrong mode, and the check's
    record for the stage report (not applicable without the payload: the run handed back none)."""
    if modes is None or not (modes.dependent_modules or modes.functional_dropout):
        return [], NotApplicable(ran=False, applicable=False, note=NOT_APPLICABLE)
    record = ModesCheck(
        ran=True,
        applicable=True,
        dependent_modules=modes.dependent_modules,
        classes=modes.classes,
        eval_while_training=len(modes.eval_while_training),
        train_under_no_grad=len(modes.train_under_no_grad),
        frozen_on_purpose=modes.frozen_on_purpose,
        library_calls=modes.library_calls,
    )
    findings = [_eval_finding(ctx, modes, r, fallback) for r in modes.eval_while_training]
    findings += [_no_grad_finding(ctx, modes, r, fallback) for r in _one_per_line(modes.train_under_no_grad)]
    findings += [_dropout_finding(ctx, modes, r, fallback) for r in modes.functional_dropout]
    # Set only where there is something to say: records of runs without them stay as they were.
    if modes.loss_target_forwards:
        record.loss_target_forwards = modes.loss_target_forwards
    if modes.functional_dropout:
        record.functional_dropout = len(modes.functional_dropout)
    return findings, record


def _dropout_finding(ctx: StageContext, modes: ModesPayload, record: FunctionalDropout, fallback: Location) -> Finding:
    call = f"F.{record.function}"
    return ctx.finding(
        category=CATEGORY,
        title=f"`{call}` ran with dropout on (p={record.p:g}) inside `{record.module}` in eval mode: `training` was left at its default, True",
        location=located.location(modes, record.site, fallback),
        problem=(
            f"The call at {_line(modes, record.site)} passed no `training=` to `{call}`, whose default is True, so it drops and rescales activations "
            f"even though the module whose forward called it, `{record.module}`, was in eval mode ({record.calls} call(s), the first after {record.first_step} optimizer step(s)). "
            "`model.eval()` does not reach a functional call: validation and inference run with dropout on, so their outputs are random and scaled."
        ),
        fix=f"Pass the module's mode: `{call}(x, p, training=self.training)`, or use the `nn.{_module_of(record.function)}` module, which follows `eval()`.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{record.calls} call(s) of {call} with training at its default inside a module in eval mode",
            data={
                "mode": "eval",
                "function": record.function,
                "p": record.p,
                "module": record.module,
                "calls": record.calls,
                "after_step": record.first_step,
                "call_site": site_record(located.site(modes, record.site)),
            },
        ),
        key=f"functional-dropout:{record.function}:{record.module}",
    )


def _module_of(function: str) -> str:
    return {"dropout": "Dropout", "dropout1d": "Dropout1d", "dropout2d": "Dropout2d", "dropout3d": "Dropout3d", "alpha_dropout": "AlphaDropout"}.get(function, "FeatureAlphaDropout")


def _one_per_line(records: list[TrainUnderNoGrad]) -> list[TrainUnderNoGrad]:
    """One record per line: a line that calls a model whose output feeds another
    (`head(backbone(x))`) has one record per outermost model, and one cause."""
    by_line: dict[int | None, TrainUnderNoGrad] = {}
    for record in records:
        first = by_line.get(record.site)
        if first is None:
            by_line[record.site] = record
            continue
        modules = [*first.modules, *(m for m in record.modules if m not in first.modules)]
        root = ", ".join(r for r in (first.root, record.root) if r) or None
        by_line[record.site] = first.model_copy(
            update={"root": root, "modules": modules, "forwards": first.forwards + record.forwards, "first_step": min(first.first_step, record.first_step)}
        )
    return list(by_line.values())


def _names(record: EvalWhileTraining | TrainUnderNoGrad) -> str:
    listed = record.modules
    return ", ".join(f"`{m.name}` ({m.class_})" for m in listed[:6]) + (", ..." if len(listed) > 6 else "")


def _line(modes: ModesPayload, index: int | None) -> str:
    found = located.site(modes, index)
    return f"{found.path}:{found.line} (`{found.code}`)" if found else "a line outside the target"


def _is_norm(module: ModeModule) -> bool:
    return module.kind == "norm"


def _short(modes: ModesPayload, index: int | None) -> str:
    found = located.site(modes, index)
    return f"{found.path}:{found.line}" if found else "a line outside the target"


def _has_norm(record: EvalWhileTraining | TrainUnderNoGrad) -> bool:
    return any(_is_norm(m) for m in record.modules)


def _eval_finding(ctx: StageContext, modes: ModesPayload, record: EvalWhileTraining, fallback: Location) -> Finding:
    model = f"`{record.root}`" if record.root else "the model"
    steps = ", ".join(str(s) for s in record.step_indexes[:10]) + (", ..." if record.steps > 10 else "")
    return ctx.finding(
        category=CATEGORY,
        title=f"{record.steps} optimizer step(s) trained {model} with {_names(record)} in eval mode, left there by the `eval()` at {_short(modes, record.eval_site)}",
        # At the cause: the `eval()` nothing undid; the training forward is named in the text and the evidence.
        location=located.location(modes, record.eval_site if record.eval_site is not None else record.site, fallback),
        problem=(
            f"The forward call at {_line(modes, record.site)} ran {_names(record)} in eval mode with gradients recorded, and the optimizer step at "
            f"{_line(modes, record.step_site)} then trained {model} on that forward. The model was put in eval mode by the call at {_line(modes, record.eval_site)} "
            f"and nothing switched it back to train mode before step {record.first_step}, the first affected: the training runs without dropout"
            + (" and normalises with the running statistics instead of the batch's" if _has_norm(record) else "")
            + f". Steps affected: {steps}."
        ),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{record.steps} step(s) after a forward with {len(record.modules)} mode-dependent module(s) in eval mode",
            data={
                "mode": "eval",
                "gradients_recorded": True,
                "model": record.root,
                "modules": [located.record(m) for m in record.modules],
                "steps_affected": record.step_indexes,
                "steps": record.steps,
                "forward_site": site_record(located.site(modes, record.site)),
                "step_site": site_record(located.site(modes, record.step_site)),
                "eval_site": site_record(located.site(modes, record.eval_site)),
            },
        ),
        key=f"eval-while-training:{record.root}",
    )


def _no_grad_finding(ctx: StageContext, modes: ModesPayload, record: TrainUnderNoGrad, fallback: Location) -> Finding:
    model = f"`{record.root}`" if record.root else "the model"
    context = "torch.inference_mode()" if record.inference_mode else "torch.no_grad()"
    norm = _has_norm(record)
    dropout = any(not _is_norm(m) for m in record.modules)
    effects = " and ".join(
        e for e, present in (("updated the norm layers' running statistics with these batches (the model changed)", norm), ("ran with dropout on", dropout)) if present
    )
    return ctx.finding(
        category=CATEGORY,
        title=f"A forward under {context} ran {model} in train mode: {_names(record)}",
        location=located.location(modes, record.site, fallback),
        problem=(
            f"The call at {_line(modes, record.site)}, under `{context}` (after {record.first_step} optimizer step(s)), ran {_names(record)} in train mode "
            f"({record.forwards} forward call(s) of these modules): they {effects}. An evaluation or inference pass without `model.eval()` reports metrics of a noisier model"
            + (" and shifts the normalisation the trained model uses." if norm else ".")
        ),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{record.forwards} forward call(s) of mode-dependent module(s) in train mode under {context}",
            data={
                "mode": "train",
                "gradients_recorded": False,
                "inference_mode": record.inference_mode,
                "model": record.root,
                "modules": [located.record(m) for m in record.modules],
                "forwards": record.forwards,
                "after_step": record.first_step,
                "forward_site": site_record(located.site(modes, record.site)),
            },
        ),
        key=f"train-under-no-grad:{record.root}",
    )
