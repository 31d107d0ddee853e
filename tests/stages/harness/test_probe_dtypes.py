"""The child-side probes on every dtype a parameter, gradient or loss can have: float64,
float32, bfloat16, float16 (and complex parameters). Each probe's hooks are called directly,
on the CPU, without installing them (installing would patch this process's torch)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from traingate.stages.concurrency.probe.params import ParamFingerprints  # noqa: E402
from traingate.stages.concurrency.probe.trace import LossTrace  # noqa: E402
from traingate.stages.harness.tensors import exact_norm, exact_sum  # noqa: E402
from traingate.stages.correctness.probe.losses import _value  # noqa: E402
from traingate.stages.harness.sites import SiteTable  # noqa: E402
from traingate.stages.correctness.probe.steps import StepWatch  # noqa: E402
from traingate.stages.correctness.probe.update import FirstStepReached, FirstUpdate  # noqa: E402
from traingate.stages.performance.probe.clock import _mean_loss  # noqa: E402

FLOATING = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
EVERY = [*FLOATING, torch.complex64, torch.complex128]
# Above float32's largest finite value (3.4e38): read through float32, it would be inf.
HUGE = 1e39


def _model(dtype: torch.dtype) -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 3).to(dtype)


def _backward(model: torch.nn.Linear) -> None:
    x = torch.randn(5, 4).to(model.weight.dtype)
    out = model(x)
    (out.abs() if out.is_complex() else out).pow(2).sum().real.backward()


def _watch() -> StepWatch:
    watch = StepWatch()
    watch.torch = torch
    watch.sites = SiteTable(Path(__file__).parent)
    return watch


def _step(watch: StepWatch, optimizer: torch.optim.Optimizer) -> None:
    watch._pre(optimizer, (), {})
    optimizer.step()
    watch._post(optimizer, (), {})


@pytest.mark.parametrize("dtype", EVERY, ids=str)
def test_exact_sum_and_norm_match_a_float64_reference(dtype: torch.dtype) -> None:
    values = torch.linspace(-3, 5, 37).to(dtype)
    real = torch.view_as_real(values).reshape(-1) if values.is_complex() else values
    reference = real.to(torch.float64)
    assert float(exact_sum(torch, values)) == pytest.approx(float(reference.sum()), rel=1e-6)
    assert float(exact_norm(torch, values)) == pytest.approx(float(torch.linalg.vector_norm(reference)), rel=1e-6)
    widest = torch.float64 if dtype in (torch.float64, torch.complex128) else torch.float32
    assert exact_sum(torch, values).dtype == widest and exact_norm(torch, values).dtype == widest


@pytest.mark.parametrize("dtype", EVERY, ids=str)
def test_step_watch_tells_a_real_step_from_an_ineffective_one(dtype: torch.dtype) -> None:
    model = _model(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = _watch()
    _backward(model)
    _step(watch, optimizer)
    assert watch.ineffective_count == 0 and watch.changed == {id(p) for p in model.parameters()}
    for group in optimizer.param_groups:
        group["lr"] = 0.0
    _step(watch, optimizer)
    assert watch.ineffective_count == 1 and watch.ineffective[0]["step"] == 1
    assert watch.collect()["non_finite_params"] == []


def test_a_float64_update_below_float32_resolution_is_a_change() -> None:
    """1 - 1e-10 is 1.0 in float32: read through float32, this real step would be ineffective."""
    weight = torch.nn.Parameter(torch.ones(10, dtype=torch.float64))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    weight.grad = torch.full_like(weight, 1e-10)
    watch = _watch()
    _step(watch, optimizer)
    assert float(weight[0]) != 1.0 and float(weight[0].float()) == 1.0
    assert watch.ineffective_count == 0 and watch.changed == {id(weight)}


@pytest.mark.parametrize("default", [torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_sampled_elements_do_not_depend_on_the_default_dtype(default: torch.dtype) -> None:
    """A target's `torch.set_default_dtype(...)`: indexes computed in float16 raise past 65504
    elements (inside the target's optimizer.step()), in bfloat16 they miss the last element."""
    weight = torch.nn.Parameter(torch.zeros(100_000, dtype=torch.float32))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    watch, recorder = _watch(), FirstUpdate()
    recorder.torch = torch
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        watch._pre(optimizer, (), {})
        recorder._pre(optimizer, (), {})
        weight.grad = torch.zeros_like(weight)
        weight.grad[-1] = 1.0  # only the last element moves: a sample of it must be the last index
        optimizer.step()
        watch._post(optimizer, (), {})
        with pytest.raises(FirstStepReached):
            recorder._post(optimizer, (), {})
    finally:
        torch.set_default_dtype(previous)
    assert watch.ineffective_count == 0 and watch.changed == {id(weight)}
    assert recorder.collect()["params"][0]["update_sample"][-1] == -1.0


@pytest.mark.parametrize("dtype", EVERY, ids=str)
def test_first_update_records_finite_norms_and_samples(dtype: torch.dtype) -> None:
    model = _model(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = FirstUpdate()
    recorder.torch = torch
    _backward(model)
    recorder._pre(optimizer, (), {})
    optimizer.step()
    with pytest.raises(FirstStepReached):
        recorder._post(optimizer, (), {})
    weight = recorder.collect()["params"][0]
    per_element = 2 if model.weight.is_complex() else 1
    assert len(weight["grad_sample"]) == len(weight["update_sample"]) == 12 * per_element
    assert all(math.isfinite(v) for v in [weight["grad_norm"], weight["update_norm"], *weight["grad_sample"], *weight["update_sample"]])
    # SGD: the update is -lr times the gradient (to the parameter's own rounding).
    assert weight["update_norm"] == pytest.approx(0.1 * weight["grad_norm"], rel=2e-2)


@pytest.mark.parametrize("dtype", FLOATING, ids=str)
def test_a_loss_is_read_in_its_own_precision(dtype: torch.dtype) -> None:
    assert _value(torch.tensor([1.5, 2.0]).to(dtype)) == 3.5
    if dtype == torch.float64:
        assert _value(torch.tensor(HUGE, dtype=dtype)) == HUGE
        assert _value(torch.tensor(1e-300, dtype=dtype)) == 1e-300
        assert float(_mean_loss([torch.tensor(HUGE, dtype=dtype), torch.tensor(3 * HUGE, dtype=dtype)])) == pytest.approx(2 * HUGE)


@pytest.mark.parametrize("dtype", EVERY, ids=str)
def test_determinism_fingerprints_and_losses_on_every_dtype(dtype: torch.dtype) -> None:
    model = _model(dtype)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trace = LossTrace()
    trace._torch = torch
    _backward(model)
    trace._on_backward([torch.full((2,), HUGE / 2, dtype=torch.float64) if dtype == torch.float64 else torch.ones(2, dtype=dtype).real])
    optimizer.step()
    trace._on_step(optimizer, (), {})
    trace.params._after_step(optimizer, (), {})
    payload = trace.collect()
    assert payload["losses"] == [[HUGE if dtype == torch.float64 else 2.0]]
    [step] = payload["params"]["steps"]
    weight_sum = float(exact_sum(torch, model.weight.detach().to(torch.complex128 if dtype.is_complex else torch.float64)))
    assert step["params"][0][0] == pytest.approx(weight_sum, rel=1e-6)
    assert all(math.isfinite(v) for row in step["params"] for v in row)


def test_param_fingerprints_are_float64_for_float64_parameters() -> None:
    """A float64 parameter's change below float32's resolution moves its float64 sum."""
    weight = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    optimizer = torch.optim.SGD([weight], lr=1.0)
    fingerprints = ParamFingerprints()
    fingerprints._after_step(optimizer, (), {})
    weight.grad = torch.full_like(weight, 1e-12)
    optimizer.step()
    fingerprints._after_step(optimizer, (), {})
    first, second = (s["params"][0][0] for s in fingerprints.collect()["steps"])
    assert first == 4.0 and second == pytest.approx(4.0 - 4e-12, abs=1e-15) and second != first
