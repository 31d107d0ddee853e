"""The GradScaler protocol checker on synthetic call sequences (no processes)."""

from __future__ import annotations

import pytest

from traingate.stages.concurrency.protocol import check, count_guarded_skips, segment
from traingate.stages.concurrency.probe.payloads import (
    AutogradGradEvent,
    BackwardEvent,
    ClipEvent,
    OptimizerStepEvent,
    ProtocolEvent,
    ScaleEvent,
    ScalerStepEvent,
    UnscaleEvent,
    UpdateEvent,
    ZeroGradEvent,
)

SITES = {"zero": 0, "scale": 1, "backward": 2, "unscale": 3, "clip": 4, "step": 5, "update": 6, "direct": 7}


def zero(opt: int = 0) -> ProtocolEvent:
    return ZeroGradEvent.model_validate({"op": "zero_grad", "opt": opt, "site": SITES["zero"]})


def scale(enabled: bool = True) -> ProtocolEvent:
    return ScaleEvent.model_validate({"op": "scale", "scaler": 0, "enabled": enabled, "site": SITES["scale"]})


def backward(scaled: bool = True) -> ProtocolEvent:
    return BackwardEvent.model_validate({"op": "backward", "scaled_by": 0 if scaled else None, "site": SITES["backward"]})


def unscale(opt: int = 0, site: str = "unscale") -> ProtocolEvent:
    return UnscaleEvent.model_validate({"op": "unscale_", "scaler": 0, "opt": opt, "enabled": True, "site": SITES[site]})


def clip(opts: tuple[int, ...] = (0,)) -> ProtocolEvent:
    return ClipEvent.model_validate({"op": "clip", "fn": "clip_grad_norm_", "opts": list(opts), "site": SITES["clip"]})


def sstep(opt: int = 0, stepped: bool = True, grads: bool = True) -> list[ProtocolEvent]:
    call = ScalerStepEvent.model_validate({"op": "scaler.step", "scaler": 0, "opt": opt, "enabled": True, "stepped": stepped, "site": SITES["step"]})
    inner = OptimizerStepEvent.model_validate({"op": "optimizer.step", "opt": opt, "via_scaler": True, "closure": False, "grads": grads, "site": SITES["step"]})
    return [call, inner] if stepped else [call]


def update() -> ProtocolEvent:
    return UpdateEvent.model_validate({"op": "update", "scaler": 0, "enabled": True, "site": SITES["update"]})


def direct_step(opt: int = 0, grads: bool = True, closure: bool = False) -> ProtocolEvent:
    return OptimizerStepEvent.model_validate({"op": "optimizer.step", "opt": opt, "via_scaler": False, "closure": closure, "grads": grads, "site": SITES["direct"]})


def documented_iteration(guard_skips: bool = False) -> list[ProtocolEvent]:
    return [zero(), scale(), backward(), unscale(), clip(), *sstep(stepped=not guard_skips), update()]


def kinds(events: list[ProtocolEvent]) -> list[tuple[str, int | None]]:
    return [(v.kind, v.site) for v in check(events).violations]


def test_documented_loop_with_accumulation_and_two_optimizers_is_clean() -> None:
    accumulate = [zero(0), zero(1), scale(), backward(), scale(), backward(), unscale(0), unscale(1), clip((0, 1)), *sstep(0), *sstep(1), update()]
    assert kinds(documented_iteration() * 3 + accumulate * 2) == []


def test_overflow_guard_that_skips_a_step_is_legal_and_counted() -> None:
    events = documented_iteration() + documented_iteration(guard_skips=True) + documented_iteration()
    result = check(events)
    assert result.violations == []
    assert result.guarded_skips == 1
    assert count_guarded_skips(events, segment(events)) == 1


def test_plain_loop_without_scaler_is_clean() -> None:
    plain = [zero(), backward(scaled=False), direct_step()]
    assert kinds(plain * 4) == []


def test_clip_before_unscale_is_reported_at_the_clip_call_once_per_iteration() -> None:
    bad = [zero(), scale(), backward(), clip(), unscale(), *sstep(), update()]
    result = check(bad * 3)
    assert [(v.kind, v.site) for v in result.violations] == [("clip-before-unscale", SITES["clip"])] * 3
    assert [v.iteration for v in result.violations] == [0, 1, 2]


def test_clip_of_unscaled_gradients_of_another_optimizer_is_not_blamed() -> None:
    events = [zero(0), zero(1), scale(), backward(), unscale(0), clip((0,)), *sstep(0), update()]
    assert kinds(events) == []


def test_direct_optimizer_step_under_a_scaled_loss_is_reported_even_when_disabled() -> None:
    events = [zero(), scale(enabled=False), backward(), direct_step()]
    result = check(events * 2)
    assert [(v.kind, v.site) for v in result.violations] == [("step-bypasses-scaler", SITES["direct"])] * 2
    assert result.violations[0].enabled is False


def test_missing_update_is_reported_at_the_step_that_lacked_it() -> None:
    events = [zero(), scale(), backward(), *sstep()] * 3
    result = check(events)
    assert {(v.kind, v.site) for v in result.violations} == {("missing-update", SITES["step"])}
    assert len(result.violations) == 3  # every step lacked its update, the last one included


def test_a_final_step_without_update_is_fine_when_update_is_called_elsewhere() -> None:
    events = documented_iteration() * 2 + [zero(), scale(), backward(), *sstep()]
    assert kinds(events) == []


def test_unscale_twice_and_after_step() -> None:
    twice = [zero(), scale(), backward(), unscale(), unscale(site="clip"), *sstep(), update()]
    assert kinds(twice) == [("unscale-twice", SITES["clip"])]
    after = [zero(), scale(), backward(), *sstep(), unscale(), update()]
    assert kinds(after) == [("unscale-after-step", SITES["unscale"])]


def test_step_on_the_previous_iterations_gradients_is_stale() -> None:
    events = [zero(), scale(), backward(), *sstep(), update(), *sstep(), update()]
    result = check(events)
    assert [(v.kind, v.iteration) for v in result.violations] == [("stale-gradients", 1)]


@pytest.mark.parametrize(
    "events",
    [
        # gradient accumulation: several backward passes, one step
        [zero(), backward(scaled=False), backward(scaled=False), direct_step(), zero(), backward(scaled=False), backward(scaled=False), direct_step()],
        # step right after zero_grad: a no-op, not stale
        [zero(), backward(scaled=False), direct_step(), zero(), direct_step()],
        # gradients set to None by the step itself are not there to reuse
        [zero(), backward(scaled=False), direct_step(), direct_step(grads=False)],
        # LBFGS-style closure computes its own backward inside step
        [zero(), backward(scaled=False), direct_step(), direct_step(closure=True)],
        # gradients from torch.autograd.grad assigned by hand
        [AutogradGradEvent.model_validate({"op": "autograd.grad", "site": 2}), direct_step(), AutogradGradEvent.model_validate({"op": "autograd.grad", "site": 2}), direct_step()],
    ],
    ids=["accumulation", "after-zero-grad", "no-grads", "closure", "autograd-grad"],
)
def test_no_stale_gradient_false_positives(events: list[ProtocolEvent]) -> None:
    assert kinds(events) == []


def test_segments_end_at_update_or_at_a_step_no_update_follows() -> None:
    events = [zero(), scale(), backward(), *sstep(), update(), zero(), backward(scaled=False), direct_step(), zero()]
    assert segment(events) == [0, 0, 0, 0, 0, 0, 1, 1, 1, 2]
