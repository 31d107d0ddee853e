"""The gate's own code in the target's process: it reads any heap without running the target's
code (`stages/harness/heap.py`), and what it raises is the gate's failure, never the target's
crash (`stages/harness/faults.py`).

The probes patch torch for the rest of a process, so the runs are made in a fresh interpreter:
the harness's run() with every instrument of the four stages' instrumented runs, on a clean loop
whose process holds what Python allows (a dead `weakref.proxy`, a class whose `__class__`,
`__getattr__`, `__len__`, `__eq__` and `__hash__` raise, a lazy module and a namespace in
`sys.modules`, a generator, a cycle), held in the loop's locals, a list and the model."""

from __future__ import annotations

import json
import weakref
from typing import Any

import pytest

from tests.harness_runs import run_requests
from traingate.stages.common.channel import ChannelSpec
from traingate.stages.concurrency.probe.payloads import CONCURRENCY_LOADERS, CONCURRENCY_RNG, CONCURRENCY_TRACE
from traingate.stages.contract import instruments
from traingate.stages.contract.messages import EntrypointRequest
from traingate.stages.correctness.stage import CHECKS, instruments_read
from traingate.stages.harness import faults, heap
from traingate.stages.performance.probe.payloads import PERFORMANCE_FULL

ODD_HEAP = '''
import sys
import types
import weakref

import torch


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(8, 16)
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        return self.head(torch.relu(self.body(x)))


class Hostile:
    @property
    def __class__(self):
        raise RuntimeError("no __class__")
    def __getattr__(self, name):
        raise RuntimeError(f"no {name}")
    def __len__(self):
        raise RuntimeError("no len")
    def __eq__(self, other):
        raise RuntimeError("no eq")
    def __hash__(self):
        raise RuntimeError("no hash")
    def __iter__(self):
        raise RuntimeError("no iter")
    def __bool__(self):
        raise RuntimeError("no bool")


class Lazy(types.ModuleType):
    """A lazy module: an unknown dunder is missing, any other name fails to import."""
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(f"lazy {name}")


class Trainer:
    """Keeps a weak proxy to an object that is gone, as lightning 1.9 keeps one to a Trainer."""
    def __init__(self):
        gone = Net()
        self.model_ref = weakref.proxy(gone)
        del gone


KEPT = []


def train(steps=12, keep=False, crash=False, misuse=False):
    trainer, hostile = Trainer(), Hostile()
    def gen():
        yield KEPT
    g = gen(); next(g)
    cycle = []; cycle.append(cycle)
    KEPT.extend([trainer, trainer.model_ref, hostile, g, cycle])
    sys.modules["odd_alias"] = torch
    sys.modules["odd_lazy"] = Lazy("odd_lazy")
    sys.modules["odd_not_a_module"] = types.SimpleNamespace(version=1)
    torch.manual_seed(0)
    model = Net()
    model.__dict__["hostile"] = hostile
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    x, y = torch.randn(64, 8), torch.randn(64, 1)
    losses = [hostile, trainer.model_ref]
    for it in range(steps):
        xb, yb = x[it % 8 * 8:(it % 8 + 1) * 8], y[it % 8 * 8:(it % 8 + 1) * 8]
        if misuse and it == 5:
            torch.ones(3).item()  # raised in C, by the function a probe wrapped: the target's
        if crash and it == 5:
            xb = xb[:, :7]  # the target's own shape error, inside a module's forward
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if keep:
            losses.append(loss)
    return {"loss": loss.item()}
'''

# A probe of the gate's whose step hook raises, and one whose patched function raises on its
# own account after the function it replaced returned: the loop's run must go on unharmed
# (the hook) and the escape be told apart from the target's own crash (the patch).
BROKEN_PROBE = '''
import torch
from {faults} import guarded


class BrokenHook:
    def install(self, ctx):
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(guarded(self._post))

    def _post(self, optimizer, args, kwargs):
        isinstance(self.proxy, torch.nn.Module)  # a dead proxy, as a heap scan meets one

    def collect(self):
        return {{"steps": 1}}


# The patch's code is compiled as one of the gate's files: it stands for a probe's own work.
PATCH = """
def make(original):
    def backward(tensor, *args, **kwargs):
        original(tensor, *args, **kwargs)
        raise ValueError("the patch's own work failed")
    return backward
"""


class BrokenPatch:
    def install(self, ctx):
        space = {{}}
        exec(compile(PATCH, {faults_file!r}, "exec"), space)
        torch.Tensor.backward = space["make"](torch.Tensor.backward)

    def collect(self):
        return {{}}
'''


EVERY_STAGE = [PERFORMANCE_FULL, CONCURRENCY_TRACE, CONCURRENCY_RNG, CONCURRENCY_LOADERS, *instruments_read(CHECKS)]
RUNS: dict[str, dict[str, Any]] = {
    **{f"odd-{index}": {"instruments": [spec], "kwargs": {}} for index, spec in enumerate(EVERY_STAGE)},
    "odd-kept": {"instruments": [PERFORMANCE_FULL], "kwargs": {"keep": True, "steps": 24}},
    **{f"crash-{index}": {"instruments": [spec], "kwargs": {"crash": True}} for index, spec in enumerate(EVERY_STAGE)},
    "misuse": {"instruments": [PERFORMANCE_FULL], "kwargs": {"misuse": True}},
    "broken-hook": {"instruments": ["broken:BrokenHook"], "kwargs": {}},
    "broken-patch": {"instruments": ["broken:BrokenPatch"], "kwargs": {}},
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    root = tmp_path_factory.mktemp("odd_heap")
    (root / "train.py").write_text(ODD_HEAP)
    (root / "broken.py").write_text(BROKEN_PROBE.format(faults=faults.__name__, faults_file=faults.__file__))
    requests = []
    for label, run in RUNS.items():
        request = EntrypointRequest(
            target_root=str(root), call="train:train", setup=None, kwargs=run["kwargs"], amp_flag=None, amp=None, seed=0, device="cpu",
            instruments=run["instruments"], instrument_options={}, deterministic=False, channel=ChannelSpec(fd=-1, nonce="unused"),
        )
        requests.append((request.model_dump_json(), str(root / f"{label}.json")))
    run_requests(root, requests)
    return {label: json.loads((root / f"{label}.json").read_text(encoding="utf-8")) for label in RUNS}


@pytest.mark.parametrize("index", range(len(EVERY_STAGE)), ids=EVERY_STAGE)
def test_every_instrument_reads_an_odd_heap_and_the_clean_loop_returns(runs: dict[str, dict[str, Any]], index: int) -> None:
    spec, result = EVERY_STAGE[index], runs[f"odd-{index}"]
    assert result["ok"] and result["exception"] is None, result["exception"]
    assert instruments.collect_error(result["instruments"][spec]) is None, result["instruments"][spec]


@pytest.mark.parametrize("index", range(len(EVERY_STAGE)), ids=EVERY_STAGE)
def test_the_targets_own_crash_under_every_instrument_stays_the_targets(runs: dict[str, dict[str, Any]], index: int) -> None:
    """A forward that raises calls the always-called hooks as torch's failure path does (no
    output): no instrument fails on it, and the crash is the target's, at its line."""
    spec, result = EVERY_STAGE[index], runs[f"crash-{index}"]
    assert not result["ok"] and result["exception"]["type"] == "RuntimeError"
    assert result["exception"]["raised_in_gate"] is False and result["exception"]["target_frame"] is not None
    assert instruments.collect_error(result["instruments"][spec]) is None, result["instruments"][spec]


def test_what_a_wrapped_c_function_raises_for_the_targets_call_is_the_targets(runs: dict[str, dict[str, Any]]) -> None:
    """`Tensor.item` is wrapped by the sync counter and written in C: the exception comes out of
    the gate's wrapper frame, handed on through `call_original`."""
    result = runs["misuse"]
    assert result["exception"]["type"] == "RuntimeError" and result["exception"]["raised_in_gate"] is False
    assert instruments.collect_error(result["instruments"][PERFORMANCE_FULL]) is None


def test_a_kept_graph_is_still_followed_past_odd_objects_in_its_list(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["odd-kept"]
    assert result["ok"], result["exception"]
    payload = result["instruments"][PERFORMANCE_FULL]
    assert instruments.collect_error(payload) is None, payload
    assert "losses" in json.dumps(payload)  # the holder is named: the list in the loop


def test_a_hook_that_raises_is_the_gates_failure_and_the_loop_goes_on(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["broken-hook"]
    assert result["ok"] and result["exception"] is None  # the target's call was not harmed
    error = instruments.collect_error(result["instruments"]["broken:BrokenHook"])
    assert error is not None and "raised inside the target's call" in error and "AttributeError" in error


def test_an_escape_from_a_patched_function_is_marked_as_the_gates(runs: dict[str, dict[str, Any]]) -> None:
    result = runs["broken-patch"]
    assert not result["ok"] and result["exception"]["type"] == "ValueError"
    assert result["exception"]["raised_in_gate"] is True  # though the target's `loss.backward()` is on the stack
    assert result["exception"]["target_frame"] is not None
    error = instruments.collect_error(result["instruments"]["broken:BrokenPatch"])
    assert error is not None and "the patch's own work failed" in error


def test_call_original_hands_on_what_the_replaced_function_raised() -> None:
    def gate_wrapper(*args: Any) -> Any:
        return faults.call_original(int, *args)

    with pytest.raises(ValueError) as caught:
        gate_wrapper("not a number")
    assert not faults.raised_in_gate(caught.value.__traceback__)
    # Code compiled as one of the gate's files: what it raises itself is the gate's.
    with pytest.raises(RuntimeError) as ours:
        exec(compile("raise RuntimeError('the gate')", faults.__file__, "exec"))
    assert faults.raised_in_gate(ours.value.__traceback__)


class _Refuses:
    @property
    def __class__(self) -> type:  # type: ignore[override]
        raise RuntimeError("no __class__")


def test_heap_reads_never_run_the_objects_code() -> None:
    import torch

    gone = torch.nn.Linear(1, 1)
    proxy = weakref.proxy(gone)
    del gone
    with pytest.raises(ReferenceError):
        isinstance(proxy, torch.nn.Module)
    assert not heap.is_a(proxy, torch.nn.Module) and not heap.is_a(_Refuses(), torch.nn.Module)
    assert heap.attributes(proxy) == [] and heap.module_file(_Refuses()) is None
    model = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert heap.roots([model, model[0]]) == [model]
