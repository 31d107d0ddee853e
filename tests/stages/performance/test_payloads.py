"""The performance instruments' payload models: what the probes really hand back validates,
and a payload of the wrong shape makes the harness result malformed, which the stage
reports as a blocking stage-error (fail closed)."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from torch.utils.data import DataLoader, TensorDataset

from traingate.stages.performance.probe.payloads import PERFORMANCE_FULL, PERFORMANCE_LIGHT
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import StageContext, run_entrypoint
from traingate.stages.contract.messages import HarnessResult
from traingate.stages.performance.probe.payloads import FullPayload, LightPayload, LoaderRecord
from traingate.stages.performance.probe.clock import _loader_info, _loader_record
from traingate.stages.performance.probe.frame_index import FrameIndex
from traingate.stages.performance.spec import PerformanceStage
from traingate.stages.contract.messages import MODELS_CONTEXT
from traingate.stages.performance.probe.payloads import MODELS

# A result read as the parent reads it: against the stage's payload models.
READ_BY_STAGE = {MODELS_CONTEXT: MODELS}

FULL, LIGHT = PERFORMANCE_FULL, PERFORMANCE_LIGHT
WARMUP, MIN_STEPS, STEPS = 3, 8, 20  # steps 11 and 19 are leak checks (8 and 16 after warm-up)

# A loop that exercises every record of the full payload: a DataLoader over a dataset of the
# target's own (loader site, `__getitem__`, waits), autocast (counts by dtype), `.item()` per
# step (a sync), a list that keeps every step's loss with its graph (a holder, its nodes, the
# line that grows it) and a running sum that keeps every step's graph (a named graph).
LOOP = '''
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset



class Points(Dataset):
    def __len__(self):
        return 32

    def __getitem__(self, index):
        generator = torch.Generator().manual_seed(index)
        return torch.randn(4, generator=generator), torch.randn(1, generator=generator)


def train(steps: int, use_amp: bool = True) -> float:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Points(), batch_size=4)
    kept = []
    total = 0.0
    logged = 0.0
    step = 0
    while step < steps:
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=use_amp):
                out = model(x)
            loss = (out.float() - y).pow(2).mean()
            loss.backward()
            optimizer.step()
            kept.append(loss)
            total = total + loss
            logged += loss.item()
            step += 1
            if step == steps:
                break
    return logged
'''

# The same loop, with the instrument's `collect()` patched from inside the target to hand back
# a held-memory series of the wrong type: what a drifted probe (or a target that tampers with
# it) would send.
TAMPERED = LOOP + '''

def tampered(steps: int) -> float:
    import sys

    probe = sys.modules["traingate.stages.performance.probe.instrument"].FullProbe
    collect = probe.collect

    def wrong_shape(self):
        payload = collect(self)
        payload["memory"]["held_bytes"] = ["a lot"] * len(payload["memory"]["held_bytes"])
        return payload

    probe.collect = wrong_shape
    return train(steps)
'''


def _context(tmp_path: Path, call: str, warm: WarmPool | None = None) -> StageContext:
    target = tmp_path / "target"
    target.mkdir(exist_ok=True)
    (target / "loop.py").write_text(TAMPERED)
    config = TargetConfig.model_validate(
        {"entrypoint": {"call": call, "kwargs": {"steps": STEPS}}, "performance": {"warmup_steps": WARMUP, "min_steps": MIN_STEPS}}
    )
    return StageContext(stage="performance", root=target, config=config, device="cpu", deadline=time.time() + 600, scratch=tmp_path / "scratch", warm=warm)


def _run(tmp_path: Path, spec: str, warm: WarmPool | None) -> dict[str, Any]:
    ctx = _context(tmp_path, "loop:train", warm)
    run = run_entrypoint(ctx, label="payload", instruments=[spec], options={"warmup_steps": WARMUP, "min_steps": MIN_STEPS}, env=ctx.child_env(OMP_NUM_THREADS="1"))
    # `ok` needs the harness result read back and validated, payload included.
    assert run.ok, run.failure()
    payload = run.instrument(spec)
    assert "error" not in payload, payload.get("error")
    return payload


# -- (1) what the probes hand back validates -----------------------------------------------
def test_the_full_probes_payload_of_a_real_run_validates_in_every_record(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    payload = FullPayload.model_validate(_run(tmp_path, FULL, warm_pool))
    clock, memory = payload.clock, payload.memory
    assert clock.steps == STEPS and len(clock.host.step) == STEPS and clock.device is None
    assert clock.forward_sites and clock.forward_sites[0][0][0] == "loop.py"
    loader = clock.loaders[0]
    assert loader.getitem is not None and loader.getitem[2] == "__getitem__" and loader.settings.batch_size == 4 and loader.step_waits
    assert memory.source == "live tensor storages (dispatch-mode registry)" and len(memory.held_bytes) == STEPS
    assert [check.step for check in memory.checks] == [WARMUP + 8, WARMUP + 16]
    holder = memory.checks[-1].holder
    assert holder is not None and holder.kind == "local" and holder.name == "kept" and holder.graph and holder.nodes
    assert any(graph.name == "total" for check in memory.checks for graph in check.graphs)
    assert memory.growth_lines and memory.growth_lines[0].site.code == "kept.append(loss)"
    assert any(record.kind == ".item()" and record.direct for record in payload.syncs.records)
    assert payload.syncs.sync_debug_mode is None  # a CPU run
    assert payload.amp.reduced_in_steps > 0 and any(use.enabled and use.dtype == "bfloat16" for use in payload.amp.autocast)
    assert payload.instrumentation.window_end is None and payload.instrumentation.instrumented_steps == STEPS


def test_the_light_probes_payload_of_a_real_run_validates(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    payload = LightPayload.model_validate(_run(tmp_path, LIGHT, warm_pool))
    assert payload.clock.steps == STEPS and len(payload.clock.losses) == STEPS
    assert all(loss is not None for loss in payload.clock.losses)  # a finite scalar loss every step
    assert payload.clock.loaders[0].fed_steps == STEPS


def test_loader_settings_given_as_numpy_values_arrive_as_plain_numbers(tmp_path: Path) -> None:
    # A DataLoader accepts numpy scalars for its counts and switches; sent as they are, the
    # result's JSON (`default=repr`) would carry "np.int64(0)" and make the run malformed.
    loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=4, num_workers=np.int64(0), pin_memory=np.bool_(False))
    record = json.loads(json.dumps(_loader_record(_loader_info(loader, FrameIndex(tmp_path))), default=repr))
    assert record["settings"] == {"batch_size": 4, "num_workers": 0, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}
    assert LoaderRecord.model_validate(record).settings.num_workers == 0


# -- (2) wrong shapes are rejected ----------------------------------------------------------
def _site(line: int) -> list[Any]:
    return ["train.py", line, "train"]


def _site_record(line: int, code: str) -> dict[str, Any]:
    return {"path": "train.py", "line": line, "function": "train", "code": code}


def _phases(steps: int) -> dict[str, list[float]]:
    return {phase: [0.001] * steps for phase in ("step", "data", "forward", "backward", "optimizer", "rest")}


def _clock(steps: int = 4) -> dict[str, Any]:
    settings = {"batch_size": 4, "num_workers": 0, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}
    loader = {"site": _site(5), "settings": settings, "dataset": "train.Points", "getitem": ["train.py", 2, "__getitem__"], "wait_s": 0.004, "batches": steps, "fed_steps": steps, "step_waits": {"0": 0.001, "1": 0.001}}
    return {
        "steps": steps, "backward_calls": steps, "training_forwards": steps, "training_device": "cpu",
        "host": _phases(steps), "device": None, "losses": [1.0] * (steps - 1) + [None], "loaders": [loader],
        "forward_sites": [[_site(9), steps]], "peak_memory_bytes": None, "truncated": False,
    }


def _holder(kind: str = "local") -> dict[str, Any]:
    return {
        "kind": kind, "name": "kept", "owner": "train", "path": "train.py", "line": 1, "held_type": "list",
        "chain": ["list"], "graph": True, "description": "local `kept` (list) in `train()`", "reference": "kept[<int>]",
    }


def _full() -> dict[str, Any]:
    retained = {"site": _site_record(10, "loss = model(x).mean()"), "storages": 8, "bytes": 32, "steps": 8}
    check = {
        "step": 11, "span": 7, "sites": [retained],
        "holder": {**_holder(), "created_at": _site_record(10, "loss = model(x).mean()"), "nodes": 40},
        "graphs": [{**_holder(), "name": "total", "nodes": 60, "created_at": None}],
    }
    return {
        "clock": _clock(),
        "memory": {
            "source": "live tensor storages (dispatch-mode registry)", "held_bytes": [100, 104, 108, 112], "peak_tracked_bytes": 4096,
            "storages_registered": 90, "checks": [check], "step_graph_nodes": 5,
            "growth_lines": [{"holder": "local `kept` (list) in `train()`", "container": "list", "depth": 0, "site": _site_record(12, "kept.append(loss)")}],
            "retained_at_end": [{**retained, "site": None}],
        },
        "syncs": {
            "records": [{"kind": ".item()", "explicit": False, "site": _site(13), "direct": True, "via": "", "per_step": {"0": 1, "1": 1}, "before_training": 0}],
            "in_data_loading": 0, "steps_counted": None, "sync_debug_mode": None,
        },
        "amp": {
            "matmul_dtypes_in_steps": {"bfloat16": 4}, "matmul_dtypes_outside_steps": {}, "reduced_in_steps": 4,
            "autocast": [{"site": _site(8), "device": "cpu", "dtype": "bfloat16", "enabled": True, "entries": 4, "matmuls": {"bfloat16": 4}}],
        },
        "sampler": {"interval_s": 0.002, "samples": [{"phase": "rest", "site": _site(13), "count": 3}]},
        "instrument_s": 0.0123,
        "instrumentation": {
            "ops_per_step": 40, "heavy_ops_per_step": 10_000, "window_end": None, "window_planned": None, "ended_steady": False,
            "instrumented_steps": 4, "graph_walk_capped": False, "graph_walk_cap": 10_000,
        },
    }


def _light() -> dict[str, Any]:
    return {"clock": _clock()}


def _result(spec: str, payload: dict[str, Any]) -> dict[str, Any]:
    return {"ok": True, "phase": "call", "exception": None, "returned": None, "duration_s": 1.0, "warnings": [], "instruments": {spec: payload}}


def _set(payload: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(payload)
    node = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


def _drop(payload: dict[str, Any], path: tuple[Any, ...]) -> dict[str, Any]:
    changed = copy.deepcopy(payload)
    node = changed
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return changed


BUILDERS = {FULL: _full, LIGHT: _light}


@pytest.mark.parametrize("spec", [FULL, LIGHT])
def test_the_hand_built_payloads_are_valid(spec: str) -> None:
    # The baseline the malformed cases below each change in one place.
    HarnessResult.model_validate(_result(spec, BUILDERS[spec]()), context=READ_BY_STAGE)


# Each case changes one thing the parent-side analyses read.
WRONG_TYPES = [
    (FULL, ("memory", "held_bytes"), ["a lot", "more"]),  # leak.decide: int(v) per step
    (FULL, ("memory", "checks", 0, "holder", "kind"), "closure"),  # stores.storing_lines picks the scope by kind
    (FULL, ("memory", "checks", 0, "graphs", 0, "nodes"), None),  # memory.growing_graphs compares counts
    (FULL, ("syncs", "records", 0, "per_step"), {"first": 1}),  # sync.by_site: int(step)
    (FULL, ("syncs", "records", 0, "site"), "train.py:13"),  # sync.by_site: site[0], site[1], site[2]
    (FULL, ("amp", "matmul_dtypes_in_steps"), [["bfloat16", 4]]),  # amp.amp_active: .values()
    (FULL, ("sampler", "samples", 0, "phase"), "forward"),  # timing.sampled_sites filters by phase
    (FULL, ("instrumentation", "instrumented_steps"), "all"),  # stage._instrumented_steps: int()
    (FULL, ("clock", "host", "step"), [0.001, 0.001]),  # 2 step times for 4 steps
    (LIGHT, ("clock", "steps"), "four"),
    (LIGHT, ("clock", "host", "rest"), [0.001, "slow", 0.001, 0.001]),  # timing.breakdown sums it
    (LIGHT, ("clock", "loaders", 0, "step_waits"), {"0": "a while"}),  # timing.wait_shares divides it
    (LIGHT, ("clock", "losses"), [1.0, 1.0, 1.0, [0.5]]),  # amp.final_loss averages them
]
MISSING = [
    (FULL, ("memory", "checks", 0, "span")),
    (FULL, ("memory", "growth_lines", 0, "depth")),
    (FULL, ("syncs", "records", 0, "direct")),
    (FULL, ("syncs", "steps_counted")),
    (FULL, ("amp", "reduced_in_steps")),
    (FULL, ("instrumentation",)),
    (LIGHT, ("clock", "training_device")),
    (LIGHT, ("clock", "loaders", 0, "fed_steps")),
]
UNKNOWN = [
    (FULL, ("extra_measure",)),
    (FULL, ("memory", "checks", 0, "holder", "owner_id")),
    (FULL, ("syncs", "records", 0, "rate")),
    (LIGHT, ("clock", "gpu_name")),
    (LIGHT, ("clock", "loaders", 0, "settings", "drop_last")),
]


def _label(case: tuple[Any, ...]) -> str:
    return f"{case[0].rsplit(':', 1)[-1]}:{'.'.join(str(k) for k in case[1])}"


def _rejected(spec: str, payload: dict[str, Any], path: tuple[Any, ...]) -> None:
    """The harness result holding `payload` is malformed, with the error at the changed key
    inside the payload (at its parent for the checks across fields: one step time per step)."""
    with pytest.raises(ValidationError) as caught:
        HarnessResult.model_validate(_result(spec, payload), context=READ_BY_STAGE)
    places = [tuple(error["loc"]) for error in caught.value.errors()]
    assert all(place[:2] == ("instruments", spec) for place in places), places
    assert any(place[2 : len(path) + 2] == path or place[2:] == path[:-1] for place in places), places


@pytest.mark.parametrize(("spec", "path", "value"), WRONG_TYPES, ids=[_label(c) for c in WRONG_TYPES])
def test_a_wrong_type_is_rejected(spec: str, path: tuple[Any, ...], value: Any) -> None:
    _rejected(spec, _set(BUILDERS[spec](), path, value), path)


@pytest.mark.parametrize(("spec", "path"), MISSING, ids=[_label(c) for c in MISSING])
def test_a_missing_key_is_rejected(spec: str, path: tuple[Any, ...]) -> None:
    _rejected(spec, _drop(BUILDERS[spec](), path), path)


@pytest.mark.parametrize(("spec", "path"), UNKNOWN, ids=[_label(c) for c in UNKNOWN])
def test_an_unknown_key_is_rejected(spec: str, path: tuple[Any, ...]) -> None:
    _rejected(spec, _set(BUILDERS[spec](), path, 1), path)


def test_a_failed_collect_passes_as_its_error_and_nothing_else_does() -> None:
    # The harness's record of a collect() that raised: the stage reports its traceback.
    HarnessResult.model_validate(_result(FULL, {"error": "Traceback (most recent call last): ..."}), context=READ_BY_STAGE)
    with pytest.raises(ValidationError):
        HarnessResult.model_validate(_result(FULL, {"error": "Traceback ...", "clock": _clock()}), context=READ_BY_STAGE)


def test_a_payload_of_the_wrong_shape_is_a_blocking_stage_error(tmp_path: Path) -> None:
    ctx = _context(tmp_path, "loop:tampered")
    outcome = PerformanceStage().run(ctx)
    assert [f.category.value for f in outcome.findings] == ["stage-error"], [f.title for f in outcome.findings]
    error = outcome.findings[0]
    assert error.blocking
    assert "a malformed result" in error.problem and "held_bytes" in error.problem
    assert not outcome.metrics  # nothing the broken run measured is reported
