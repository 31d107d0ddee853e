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
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeGuard

from traingate.stages.concurrency.details import ProtocolDetails
from traingate.pipeline.model.rules import Rule
from traingate.stages.concurrency.rules import RULES as STAGE_RULES
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location
from traingate.stages.base import StageContext, location_of
from traingate.stages.contract.payloads.base import Site
from traingate.stages.concurrency.probe.payloads import (
    AutogradGradEvent,
    BackwardEvent,
    ClipEvent,
    OptimizerStepEvent,
    ProtocolEvent,
    ProtocolTracePayload,
    ScaleEvent,
    ScalerStepEvent,
    UnscaleEvent,
    UpdateEvent,
    ZeroGradEvent,
)
from traingate.stages.concurrency.rules import GRADSCALER_PROTOCOL

CATEGORY = GRADSCALER_PROTOCOL
READY, UNSCALED, STEPPED = "ready", "unscaled", "stepped"

# Each violation kind is one sub-rule of the rule table (`gradscaler-protocol/<kind>`): its
# description is the finding's title, its check what happened, then its impact and fix.
RULES: dict[str, Rule] = {rule.sub: rule for rule in STAGE_RULES if rule.category is GRADSCALER_PROTOCOL and rule.sub}

STEP_OPS = ("scaler.step", "optimizer.step")
# The calls that name a GradScaler, and so whether it was enabled.
_SCALER_EVENTS = (ScaleEvent, UnscaleEvent, ScalerStepEvent, UpdateEvent)


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

    @property
    def iterations(self) -> int:
        return max(self.iteration_of, default=-1) + 1


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


# Records a violation: (kind, event index, scaler, optimizer).
_Add = Callable[[str, int, int | None, int | None], None]


def is_inner_step(event: ProtocolEvent) -> TypeGuard[OptimizerStepEvent]:
    """The optimizer.step that scaler.step makes itself: part of that call, not a new one."""
    return isinstance(event, OptimizerStepEvent) and event.via_scaler


def segment(events: list[ProtocolEvent]) -> list[int]:
    """Iteration index of each event: an iteration ends with `update`, or with a step that
    no `update` or further step follows."""
    significant = [i for i, e in enumerate(events) if not is_inner_step(e)]
    ends: set[int] = set()
    for pos, i in enumerate(significant):
        op = events[i].op
        following = events[significant[pos + 1]].op if pos + 1 < len(significant) else None
        if op == "update" or (op in STEP_OPS and following not in ("update", *STEP_OPS)):
            ends.add(i)
    iteration, result = 0, []
    for i, _ in enumerate(events):
        result.append(iteration)
        if i in ends:
            iteration += 1
    return result


def check(events: list[ProtocolEvent]) -> ProtocolCheck:
    """Violations of the protocol, in event order."""
    iteration_of = segment(events)
    checker = _Checker(events, iteration_of)
    for i, e in enumerate(events):
        checker.event(i, e)
    state = checker.state
    for (scaler, _opt), stage in list(state.stage.items()):
        if stage == STEPPED and scaler not in state.updated:
            _flag_pending_steps(state, scaler, checker.add)
    steps = sum(1 for e in events if e.op in STEP_OPS and not is_inner_step(e))
    return ProtocolCheck(sorted(checker.found, key=lambda v: v.event), iteration_of, count_guarded_skips(events, iteration_of), steps)


class _Checker:
    """The protocol state over the calls so far, and the violations found."""

    def __init__(self, events: list[ProtocolEvent], iteration_of: list[int]) -> None:
        self.events, self.iteration_of = events, iteration_of
        self.state = _State()
        self.found: list[Violation] = []

    def add(self, kind: str, index: int, scaler: int | None, optimizer: int | None) -> None:
        e = self.events[index]
        enabled = e.enabled if isinstance(e, _SCALER_EVENTS) else _enabled(self.events, scaler, index)
        self.found.append(Violation(kind, index, e.site, self.iteration_of[index], scaler, optimizer, enabled))

    def event(self, i: int, e: ProtocolEvent) -> None:
        state = self.state
        if isinstance(e, AutogradGradEvent):
            state.backward_at.append(i)
        elif isinstance(e, BackwardEvent):
            state.backward_at.append(i)
            if e.scaled_by is not None:
                state.scaled_backward_at.append((i, e.scaled_by))
        elif isinstance(e, ScaleEvent):
            _flag_pending_steps(state, e.scaler, self.add)
        elif isinstance(e, UnscaleEvent):
            self._unscale(i, e)
        elif isinstance(e, ClipEvent):
            self._clip(i, e)
        elif isinstance(e, ScalerStepEvent):
            self._scaler_step(i, e)
        elif isinstance(e, OptimizerStepEvent) and not is_inner_step(e):
            self._optimizer_step(i, e)
        elif isinstance(e, UpdateEvent):
            state.updated.add(e.scaler)
            for key in [k for k in state.stage if k[0] == e.scaler]:
                state.stage[key] = READY
        elif isinstance(e, ZeroGradEvent):
            self._zero_grad(i, e)

    def _unscale(self, i: int, e: UnscaleEvent) -> None:
        key = (e.scaler, e.opt)
        stage = self.state.stage.get(key, READY)
        if stage == UNSCALED:
            self.add("unscale-twice", i, *key)
        elif stage == STEPPED:
            self.add("unscale-after-step", i, *key)
        else:
            self.state.stage[key] = UNSCALED

    def _clip(self, i: int, e: ClipEvent) -> None:
        for opt in e.opts:
            scaler = _scaled_since(self.state, opt)
            if scaler is not None and self.state.stage.get((scaler, opt), READY) == READY:
                self.add("clip-before-unscale", i, scaler, opt)
                break

    def _scaler_step(self, i: int, e: ScalerStepEvent) -> None:
        state, key = self.state, (e.scaler, e.opt)
        if state.stage.get(key) == STEPPED and state.step_event[key] not in state.flagged_steps:
            state.flagged_steps.add(state.step_event[key])
            self.add("missing-update", state.step_event[key], *key)
        inner = self.events[i + 1] if i + 1 < len(self.events) else None
        if inner is not None and is_inner_step(inner) and _is_stale(state, key[1], inner):
            self.add("stale-gradients", i, *key)
        state.stage[key] = STEPPED
        state.step_event[key] = i
        _stepped(state, key[1], i)

    def _optimizer_step(self, i: int, e: OptimizerStepEvent) -> None:
        scaler = _scaled_since(self.state, e.opt)
        if scaler is not None:
            self.add("step-bypasses-scaler", i, scaler, e.opt)
        if _is_stale(self.state, e.opt, e):
            self.add("stale-gradients", i, scaler, e.opt)
        _stepped(self.state, e.opt, i)

    def _zero_grad(self, i: int, e: ZeroGradEvent) -> None:
        if e.opt is not None:
            opt_state = self.state.optimizers.setdefault(e.opt, _Optimizer())
            opt_state.mark, opt_state.zeroed = i, True
        else:
            self.state.module_zero_at = i
            for opt_state in self.state.optimizers.values():
                opt_state.zeroed = True


def _enabled(events: list[ProtocolEvent], scaler: int | None, before: int) -> bool | None:
    for e in reversed(events[:before]):
        if isinstance(e, _SCALER_EVENTS) and e.scaler == scaler:
            return e.enabled
    return None


def _flag_pending_steps(state: _State, scaler: int, add: _Add) -> None:
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


def _is_stale(state: _State, opt: int, step_event: OptimizerStepEvent) -> bool:
    """A step with gradients present, none produced since the previous step, none cleared.

    Several backward passes before one step (gradient accumulation) are legal; a step
    right after zero_grad is a no-op, not a stale one; a closure computes its own backward.
    """
    opt_state = state.optimizers.setdefault(opt, _Optimizer())
    if not opt_state.stepped or opt_state.zeroed or step_event.closure or not step_event.grads:
        return False
    since = len(state.backward_at) - bisect.bisect_right(state.backward_at, _mark(state, opt))
    return since == 0


def _stepped(state: _State, opt: int, index: int) -> None:
    opt_state = state.optimizers.setdefault(opt, _Optimizer())
    opt_state.mark, opt_state.zeroed, opt_state.stepped = index, False, True


def count_guarded_skips(events: list[ProtocolEvent], iteration_of: list[int]) -> int:
    """Iterations that had unscale_ and update but no step actually taken: the overflow guard
    `if torch.isfinite(norm): scaler.step(opt)` (or a step the scaler skipped on inf)."""
    by_iteration: dict[int, set[str]] = {}
    for e, it in zip(events, iteration_of, strict=True):
        ops = by_iteration.setdefault(it, set())
        if isinstance(e, ScalerStepEvent) and not e.stepped:
            continue
        ops.add(e.op)
    return sum(1 for ops in by_iteration.values() if {"unscale_", "update"} <= ops and not ops & set(STEP_OPS))


def _call_text(event: ProtocolEvent) -> str:
    """The call as a reader would write it."""
    if isinstance(event, ScaleEvent):
        return "scaler.scale(loss)"
    if isinstance(event, BackwardEvent):
        return "backward()" + (" on the scaled loss" if event.scaled_by is not None else "")
    if isinstance(event, UnscaleEvent):
        return "scaler.unscale_(optimizer)"
    if isinstance(event, ClipEvent):
        return f"torch.nn.utils.{event.fn}(...)"
    if isinstance(event, ScalerStepEvent):
        return "scaler.step(optimizer)" + ("" if event.stepped else " (step skipped by the scaler)")
    if isinstance(event, OptimizerStepEvent):
        return "optimizer.step()" + (" (inside scaler.step)" if event.via_scaler else "")
    if isinstance(event, UpdateEvent):
        return "scaler.update()"
    if isinstance(event, ZeroGradEvent):
        return "optimizer.zero_grad()" if event.opt is not None else f"{event.module}.zero_grad()"
    return event.op


def label(event: ProtocolEvent, sites: list[Site]) -> str:
    """One line per call, as a reader would write the loop."""
    text = _call_text(event)
    site = sites[event.site] if event.site is not None and event.site < len(sites) else None
    return f"{text}  @ {site.path}:{site.line}" if site else text


def iteration_sequence(events: list[ProtocolEvent], iteration_of: list[int], iteration: int, sites: list[Site], limit: int = 40) -> list[str]:
    picked = [label(e, sites) for e, it in zip(events, iteration_of, strict=True) if it == iteration]
    return picked[:limit] + ([f"... {len(picked) - limit} more calls"] if len(picked) > limit else [])


def representative_iteration(events: list[ProtocolEvent], iteration_of: list[int]) -> int | None:
    """The first iteration that took a step: what one training iteration looked like."""
    for e, it in zip(events, iteration_of, strict=True):
        if e.op in STEP_OPS and not is_inner_step(e):
            return it
    return iteration_of[0] if iteration_of else None


def protocol_findings(ctx: StageContext, trace: ProtocolTracePayload, fallback: Location | None) -> tuple[list[Finding], ProtocolCheck]:
    """One `gradscaler-protocol` finding per rule and call site, with the observed iteration;
    and the check itself, for `protocol_details`."""
    events, sites = trace.events, trace.sites
    result = check(events)
    grouped: dict[tuple[str, int | None], list[Violation]] = {}
    for v in result.violations:
        grouped.setdefault((v.kind, v.site), []).append(v)
    findings = []
    for (kind, site_index), group in grouped.items():
        first = group[0]
        site = sites[site_index] if site_index is not None and site_index < len(sites) else None
        location = location_of(site) or fallback
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
                    summary=f"{kind} in {len(iterations)} of {result.iterations} iteration(s); scaler {state.split(' ')[0]}",
                    data={
                        "rule": kind,
                        "iterations": len(iterations),
                        "first_iteration": first.iteration,
                        "observed_sequence": sequence,
                        "scaler_enabled": enabled,
                        "site_code": site.code if site else None,
                    },
                ),
                key=f"{kind}:{site.code if site else ''}",
            )
        )
    return findings, result


def protocol_details(trace: ProtocolTracePayload, result: ProtocolCheck) -> ProtocolDetails:
    shown = representative_iteration(trace.events, result.iteration_of)
    guard_note = None
    if result.guarded_skips:
        guard_note = (
            f"{result.guarded_skips} iteration(s) called unscale_ and update but took no step "
            "(an overflow guard such as `if torch.isfinite(norm): scaler.step(optimizer)`, or a step the scaler skipped "
            "on inf/NaN gradients): this is legal, update() still ran."
        )
    return ProtocolDetails(
        ran=True,
        events=len(trace.events),
        dropped_events=trace.dropped_events,
        iterations=result.iterations,
        steps=result.steps,
        scalers=trace.scalers,
        sequence_iteration=shown,
        sequence=iteration_sequence(trace.events, result.iteration_of, shown, trace.sites) if shown is not None else [],
        guarded_skips=result.guarded_skips,
        guard_note=guard_note,
        violations=len(result.violations),
    )
