"""`gradscaler-protocol`: the documented GradScaler call order, checked on observed calls.

The documented loop (PyTorch "Automatic Mixed Precision examples", Gradient clipping):

    scaler.scale(loss).backward()        # several times under gradient accumulation
    scaler.unscale_(optimizer)           # only if gradients are read or modified
    torch.nn.utils.clip_grad_norm_(...)  # on unscaled gradients
    scaler.step(optimizer)               # may be skipped by an overflow guard
    scaler.update()

The checker reads the events `traingate.stages.concurrency.probe.trace.ProtocolTrace` recorded and reports
an order only when it was observed. The order is checked even when the scaler is disabled
(`enabled=False`): the same code is wrong once it runs with scaling on.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from traingate.pipeline.rules import Rule, sub_rules
from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import StageContext

CATEGORY = Category.GRADSCALER_PROTOCOL
READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"

# Each violation kind is one sub-rule of the rule table (`gradscaler-protocol/<kind>`): its
# description is the finding's title, its check what happened, then its impact and fix.
RULES: dict[str, Rule] = {rule.sub: rule for rule in sub_rules(Category.GRADSCALER_PROTOCOL)}

STEP_OPS = ("scaler.step", "optimizer.step")


@dataclass(frozen=True)
class Violation:
    kind: str
    event: int  # index of the offending call in the event list
    site: int | None
    iteration: int
    scaler: int | None
    optimizer: int | None
    enabled: bool | None


@dataclass
class ProtocolCheck:
    violations: list[Violation]
    iteration_of: list[int]
    guarded_skips: int  # iterations that skipped the step after unscale_ + update
    steps: int


@dataclass
class _Optimizer:
    mark: int = -1  # event index of the last step or zero_grad
    zeroed: bool = False  # zero_grad since the last step
    stepped: bool = False


@dataclass
class _State:
    stage: dict[tuple[int, int], str] = field(default_factory=dict)
    step_event: dict[tuple[int, int], int] = field(default_factory=dict)
    flagged_steps: set[int] = field(default_factory=set)
    updated: set[int] = field(default_factory=set)
    optimizers: dict[int, _Optimizer] = field(default_factory=dict)
    backward_at: list[int] = field(default_factory=list)
    scaled_backward_at: list[tuple[int, int]] = field(default_factory=list)  # (event, scaler)
    module_zero_at: int = -1


def is_inner_step(event: dict[str, Any]) -> bool:
    """The optimizer.step that scaler.step makes itself: part of that call, not a new one."""
    return event.get("op") == "optimizer.step" and bool(event.get("via_scaler"))


def segment(events: list[dict[str, Any]]) -> list[int]:
    """Iteration index of each event: an iteration ends with `update`, or with a step that
    no `update` or further step follows."""
    significant = [i for i, e in enumerate(events) if not is_inner_step(e)]
    ends: set[int] = set()
    for pos, i in enumerate(significant):
        op = events[i]["op"]
        following = events[significant[pos + 1]]["op"] if pos + 1 < len(significant) else None
        if op == "update" or (op in STEP_OPS and following not in ("update", *STEP_OPS)):
            ends.add(i)
    iteration, result = 0, []
    for i, _ in enumerate(events):
        result.append(iteration)
        if i in ends:
            iteration += 1
    return result


def check(events: list[dict[str, Any]]) -> ProtocolCheck:
    """Violations of the protocol, in event order."""
    iteration_of = segment(events)
    state = _State()
    found: list[Violation] = []

    def add(kind: str, index: int, scaler: int | None, optimizer: int | None) -> None:
        e = events[index]
        found.append(Violation(kind, index, e.get("site"), iteration_of[index], scaler, optimizer, e.get("enabled", _enabled(events, scaler, index))))

    for i, e in enumerate(events):
        op = e.get("op")
        if op == "autograd.grad":
            state.backward_at.append(i)
        elif op == "backward":
            state.backward_at.append(i)
            if e.get("scaled_by") is not None:
                state.scaled_backward_at.append((i, int(e["scaled_by"])))
        elif op == "scale":
            _flag_pending_steps(state, int(e["scaler"]), add)
        elif op == "unscale_":
            key = (int(e["scaler"]), int(e["opt"]))
            stage = state.stage.get(key, READY)
            if stage == UNSCALED:
                add("unscale-twice", i, *key)
            elif stage == STEPPED:
                add("unscale-after-step", i, *key)
            else:
                state.stage[key] = UNSCALED
        elif op == "clip":
            for opt in e.get("opts") or []:
                scaler = _scaled_since(state, opt)
                if scaler is not None and state.stage.get((scaler, opt), READY) == READY:
                    add("clip-before-unscale", i, scaler, opt)
                    break
        elif op == "scaler.step":
            key = (int(e["scaler"]), int(e["opt"]))
            if state.stage.get(key) == STEPPED and state.step_event[key] not in state.flagged_steps:
                state.flagged_steps.add(state.step_event[key])
                add("missing-update", state.step_event[key], *key)
            inner = events[i + 1] if i + 1 < len(events) and is_inner_step(events[i + 1]) else None
            if inner is not None and _is_stale(state, key[1], inner):
                add("stale-gradients", i, *key)
            state.stage[key] = STEPPED
            state.step_event[key] = i
            _stepped(state, key[1], i)
        elif op == "optimizer.step" and not is_inner_step(e):
            opt = int(e["opt"])
            scaler = _scaled_since(state, opt)
            if scaler is not None:
                add("step-bypasses-scaler", i, scaler, opt)
            if _is_stale(state, opt, e):
                add("stale-gradients", i, scaler, opt)
            _stepped(state, opt, i)
        elif op == "update":
            scaler = int(e["scaler"])
            state.updated.add(scaler)
            for key in [k for k in state.stage if k[0] == scaler]:
                state.stage[key] = READY
        elif op == "zero_grad":
            if e.get("opt") is not None:
                opt_state = state.optimizers.setdefault(int(e["opt"]), _Optimizer())
                opt_state.mark, opt_state.zeroed = i, True
            else:
                state.module_zero_at = i
                for opt_state in state.optimizers.values():
                    opt_state.zeroed = True
    for (scaler, _opt), stage in list(state.stage.items()):
        if stage == STEPPED and scaler not in state.updated:
            _flag_pending_steps(state, scaler, add)
    steps = sum(1 for e in events if e.get("op") in STEP_OPS and not is_inner_step(e))
    return ProtocolCheck(sorted(found, key=lambda v: v.event), iteration_of, count_guarded_skips(events, iteration_of), steps)


def _enabled(events: list[dict[str, Any]], scaler: int | None, before: int) -> bool | None:
    for e in reversed(events[:before]):
        if e.get("scaler") == scaler and "enabled" in e:
            return bool(e["enabled"])
    return None


def _flag_pending_steps(state: _State, scaler: int, add: Any) -> None:
    for key, stage in state.stage.items():
        if key[0] == scaler and stage == STEPPED and state.step_event[key] not in state.flagged_steps:
            state.flagged_steps.add(state.step_event[key])
            add("missing-update", state.step_event[key], *key)


def _mark(state: _State, opt: int) -> int:
    return max(state.optimizers.setdefault(opt, _Optimizer()).mark, state.module_zero_at)


def _scaled_since(state: _State, opt: int) -> int | None:
    """The scaler whose scaled loss produced the optimizer's current gradients, if any."""
    if not state.scaled_backward_at:
        return None
    index, scaler = state.scaled_backward_at[-1]
    return scaler if index > _mark(state, opt) else None


def _is_stale(state: _State, opt: int, step_event: dict[str, Any]) -> bool:
    """A step with gradients present, none produced since the previous step, none cleared.

    Several backward passes before one step (gradient accumulation) are legal; a step
    right after zero_grad is a no-op, not a stale one; a closure computes its own backward.
    """
    opt_state = state.optimizers.setdefault(opt, _Optimizer())
    if not opt_state.stepped or opt_state.zeroed or step_event.get("closure") or not step_event.get("grads", True):
        return False
    since = len(state.backward_at) - bisect.bisect_right(state.backward_at, _mark(state, opt))
    return since == 0


def _stepped(state: _State, opt: int, index: int) -> None:
    opt_state = state.optimizers.setdefault(opt, _Optimizer())
    opt_state.mark, opt_state.zeroed, opt_state.stepped = index, False, True


def count_guarded_skips(events: list[dict[str, Any]], iteration_of: list[int]) -> int:
    """Iterations that had unscale_ and update but no step actually taken: the overflow guard
    `if torch.isfinite(norm): scaler.step(opt)` (or a step the scaler skipped on inf)."""
    by_iteration: dict[int, set[str]] = {}
    for e, it in zip(events, iteration_of, strict=True):
        ops = by_iteration.setdefault(it, set())
        if e["op"] == "scaler.step" and not e.get("stepped", True):
            continue
        ops.add(e["op"])
    return sum(1 for ops in by_iteration.values() if {"unscale_", "update"} <= ops and not ops & set(STEP_OPS))


def label(event: dict[str, Any], sites: list[dict[str, Any]]) -> str:
    """One line per call, as a reader would write the loop."""
    op = event["op"]
    text = {
        "scale": "scaler.scale(loss)",
        "backward": "backward()" + (" on the scaled loss" if event.get("scaled_by") is not None else ""),
        "unscale_": "scaler.unscale_(optimizer)",
        "clip": f"torch.nn.utils.{event.get('fn', 'clip_grad_norm_')}(...)",
        "scaler.step": "scaler.step(optimizer)" + ("" if event.get("stepped", True) else " (step skipped by the scaler)"),
        "optimizer.step": "optimizer.step()" + (" (inside scaler.step)" if event.get("via_scaler") else ""),
        "update": "scaler.update()",
        "zero_grad": "optimizer.zero_grad()" if event.get("opt") is not None else f"{event.get('module', 'module')}.zero_grad()",
    }.get(op, op)
    site = sites[event["site"]] if event.get("site") is not None and event["site"] < len(sites) else None
    return f"{text}  @ {site['path']}:{site['line']}" if site else text


def iteration_sequence(events: list[dict[str, Any]], iteration_of: list[int], iteration: int, sites: list[dict[str, Any]], limit: int = 40) -> list[str]:
    picked = [label(e, sites) for e, it in zip(events, iteration_of, strict=True) if it == iteration]
    return picked[:limit] + ([f"... {len(picked) - limit} more calls"] if len(picked) > limit else [])


def representative_iteration(events: list[dict[str, Any]], iteration_of: list[int]) -> int | None:
    """The first iteration that took a step: what one training iteration looked like."""
    for e, it in zip(events, iteration_of, strict=True):
        if e["op"] in STEP_OPS and not is_inner_step(e):
            return it
    return iteration_of[0] if iteration_of else None


def protocol_findings(ctx: StageContext, trace: dict[str, Any], fallback: Location | None) -> tuple[list[Finding], dict[str, Any]]:
    """One `gradscaler-protocol` finding per rule and call site, with the observed iteration."""
    events: list[dict[str, Any]] = trace.get("events", [])
    sites: list[dict[str, Any]] = trace.get("sites", [])
    result = check(events)
    grouped: dict[tuple[str, int | None], list[Violation]] = {}
    for v in result.violations:
        grouped.setdefault((v.kind, v.site), []).append(v)
    findings = []
    for (kind, site_index), group in grouped.items():
        first = group[0]
        site = sites[site_index] if site_index is not None and site_index < len(sites) else None
        location = Location(path=site["path"], line=site["line"], function=site["function"]) if site else fallback
        iterations = sorted({v.iteration for v in group})
        rule = RULES[kind]
        enabled = first.enabled
        state = "enabled" if enabled else ("disabled (enabled=False): the order is wrong either way" if enabled is not None else "not observed")
        sequence = iteration_sequence(events, result.iteration_of, first.iteration, sites)
        findings.append(
            ctx.finding(
                category=CATEGORY,
                rule=rule.id,
                title=rule.description,
                location=location,
                problem=f"{rule.check} Observed in {len(iterations)} iteration(s); the GradScaler was {state}.",
                evidence=Evidence(
                    kind=EvidenceKind.OBSERVED,
                    summary=f"{kind} in {len(iterations)} of {max(result.iteration_of, default=-1) + 1} iteration(s); scaler {state.split(' ')[0]}",
                    data={
                        "rule": kind,
                        "iterations": len(iterations),
                        "first_iteration": first.iteration,
                        "observed_sequence": sequence,
                        "scaler_enabled": enabled,
                        "site_code": site["code"] if site else None,
                    },
                ),
                key=f"{kind}:{site['code'] if site else ''}",
            )
        )
    details = protocol_details(trace, result)
    return findings, details


def protocol_details(trace: dict[str, Any], result: ProtocolCheck) -> dict[str, Any]:
    events: list[dict[str, Any]] = trace.get("events", [])
    sites: list[dict[str, Any]] = trace.get("sites", [])
    shown = representative_iteration(events, result.iteration_of)
    guard_note = None
    if result.guarded_skips:
        guard_note = (
            f"{result.guarded_skips} iteration(s) called unscale_ and update but took no step "
            "(an overflow guard such as `if torch.isfinite(norm): scaler.step(optimizer)`, or a step the scaler skipped "
            "on inf/NaN gradients): this is legal, update() still ran."
        )
    return {
        "ran": True,
        "events": len(events),
        "dropped_events": trace.get("dropped_events", 0),
        "iterations": max(result.iteration_of, default=-1) + 1,
        "steps": result.steps,
        "scalers": trace.get("scalers", []),
        "sequence_iteration": shown,
        "sequence": iteration_sequence(events, result.iteration_of, shown, sites) if shown is not None else [],
        "guarded_skips": result.guarded_skips,
        "guard_note": guard_note,
        "violations": len(result.violations),
    }
