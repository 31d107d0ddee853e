"""The concurrency instruments' payload models: what the probes really hand back validates, on
every path (the CUDA watches' CPU and CUDA paths included), and a payload of the wrong shape
makes the whole harness result malformed, which the stage reports as a stage error."""

from __future__ import annotations

import copy
import math
import os
import textwrap
import time
import traceback
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from traingate.stages.concurrency.probe.payloads import CONCURRENCY_LOADERS, CONCURRENCY_LOSSES, CONCURRENCY_NONBLOCKING, CONCURRENCY_RNG, CONCURRENCY_STREAMS, CONCURRENCY_TRACE
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.supervision.isolation import ChildResult
from traingate.pipeline.supervision.warm_pool import WarmPool
from traingate.stages.base import EntrypointRun, StageContext, read_harness_result, run_entrypoint
from traingate.stages.concurrency import stage as concurrency_stage
from traingate.stages.concurrency.probe.params import DETAILED_STEPS
from traingate.stages.concurrency.spec import ConcurrencyStage
from traingate.stages.common.channel import ChannelSpec, ChannelWriter, new_nonce
from traingate.stages.contract.messages import HARNESS_RESULT, HarnessResult
from traingate.stages.concurrency.probe.payloads import MODELS as CONCURRENCY_MODELS
from traingate.stages.contract.messages import MODELS_CONTEXT

# A result read as the parent reads it: against the stage's payload models.
READ_BY_STAGE = {MODELS_CONTEXT: CONCURRENCY_MODELS}

CONCURRENCY = [
    CONCURRENCY_TRACE,
    CONCURRENCY_LOSSES,
    CONCURRENCY_RNG,
    CONCURRENCY_LOADERS,
    CONCURRENCY_NONBLOCKING,
    CONCURRENCY_STREAMS,
]


def test_every_concurrency_instrument_has_its_model() -> None:
    assert set(CONCURRENCY_MODELS) == set(CONCURRENCY)
    assert all(spec.startswith("traingate.stages.concurrency.probe.") for spec in CONCURRENCY)


# -- payloads captured from a real run ------------------------------------------------------------

# One loop that takes every path the CPU probes record: the full GradScaler protocol with
# clipping, both zero_grads and autograd.grad, more steps than the per-parameter fingerprints
# keep, an entropy seed and a seeded generator, a DataLoader its settings break, a worker that
# raises, and a loader whose lambda cannot be pickled for spawn.
TRAIN = '''
import random

import torch
from torch.utils.data import DataLoader, Dataset



class Rows(Dataset):
    def __init__(self, n, transform=None, fail_at=None):
        self.x, self.y = torch.randn(n, 4), torch.randn(n, 1)
        self.transform, self.fail_at = transform, fail_at

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i == self.fail_at:
            raise KeyError(i)
        x = self.x[i]
        return (self.transform(x) if self.transform else x), self.y[i]


def train(steps):
    random.seed()
    torch.Generator().manual_seed(3)
    try:
        DataLoader(Rows(4), num_workers=0, prefetch_factor=2)
    except ValueError:
        pass
    try:
        next(iter(DataLoader(Rows(4, fail_at=0), batch_size=2, num_workers=1)))
    except KeyError:
        pass
    batches = list(DataLoader(Rows(8, transform=lambda t: t * 2), batch_size=4, num_workers=1))
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(steps):
        x, y = batches[step % len(batches)]
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
    model.zero_grad()
    torch.autograd.grad(model(x).sum(), model.weight)
    return {"loss": loss.item()}
'''


def _context(root: Path, scratch: Path, steps: int, warm: WarmPool | None = None) -> StageContext:
    config = TargetConfig.model_validate({"entrypoint": {"call": "train:train", "kwargs": {"steps": steps}}})
    return StageContext(stage="concurrency", root=root, config=config, device="cpu", deadline=time.time() + 240, scratch=scratch, warm=warm)


@pytest.mark.slow
def test_payloads_of_a_real_cpu_run_validate_on_every_recorded_path(tmp_path: Path, warm_pool: WarmPool | None) -> None:
    root = tmp_path / "target"
    root.mkdir()
    (root / "train.py").write_text(TRAIN)
    steps = DETAILED_STEPS + 4
    ctx = _context(root, tmp_path / "scratch", steps, warm_pool)
    options = {"concurrency": {"start_methods": ["fork", "spawn"], "probe_timeout_s": 60.0}}
    run = run_entrypoint(ctx, label="payloads", instruments=CONCURRENCY, options=options)
    # A payload its model rejects would have made the whole result malformed.
    assert run.channel_problem is None and run.ok, run.failure() or run.child.stderr[-3000:]
    for spec in CONCURRENCY:
        assert "error" not in run.instrument(spec), run.instrument(spec)
        CONCURRENCY_MODELS[spec].model_validate(run.instrument(spec))

    trace = run.instrument(CONCURRENCY_TRACE)
    ops = {event["op"] for event in trace["events"]}
    assert ops == {"scale", "backward", "unscale_", "clip", "scaler.step", "optimizer.step", "update", "zero_grad", "autograd.grad"}
    assert {"module": "Linear"}.items() <= next(e for e in trace["events"] if e["op"] == "zero_grad" and e.get("module")).items()
    for payload in (trace, run.instrument(CONCURRENCY_LOSSES)):
        assert payload["steps"] == steps and len(payload["losses"]) == steps
        fingerprints = payload["params"]["steps"]
        assert len(fingerprints) == steps
        assert "params" in fingerprints[DETAILED_STEPS - 1] and "params" not in fingerprints[DETAILED_STEPS]

    seeding = run.instrument(CONCURRENCY_RNG)["records"]
    assert {(r["api"], r["entropy"]) for r in seeding} == {("random.seed", True), ("torch.Generator.manual_seed", False)}

    loaders = run.instrument(CONCURRENCY_LOADERS)
    assert [e["type"] for e in loaders["construction_errors"]] == ["ValueError"]
    # Only the training's own worker error: the spawn check's failure of the same row is its result.
    [error] = loaders["errors"]
    assert error["kind"] == "worker-exception" and error["site"] is not None
    checks = loaders["start_method_checks"]
    assert {c["method"] for c in checks} == {"spawn"} and len(checks) == 2
    assert sorted(c["pickle"]["ok"] for c in checks) == [False, True]
    assert all(c["batch"]["ok"] is False for c in checks)  # the lambda, and the row that raises

    assert run.instrument(CONCURRENCY_NONBLOCKING) == {"available": False, "copies": 0, "races": []}
    assert run.instrument(CONCURRENCY_STREAMS) == {"available": False, "reports": [], "total": 0}


# -- the CUDA-only watches, on both of their paths ----------------------------------------------


class _HarnessContext:
    def __init__(self, root: Path) -> None:
        self.root, self.options = root, {}


def test_cuda_watches_on_a_cpu_hand_back_empty_payloads_that_validate(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    from traingate.stages.concurrency.probe.cuda import NonBlockingWatch, StreamSanitizer

    if torch.cuda.is_available():
        pytest.skip("the CPU path: install returns before anything when CUDA is missing")
    for spec, watch in ((CONCURRENCY_NONBLOCKING, NonBlockingWatch()), (CONCURRENCY_STREAMS, StreamSanitizer())):
        watch.install(_HarnessContext(tmp_path))
        CONCURRENCY_MODELS[spec].model_validate(watch.collect())
        assert watch.collect()["available"] is False


def test_cuda_path_records_validate(tmp_path: Path) -> None:
    """The records the watches write on CUDA, made by their own methods: a pending copy read
    before a synchronisation, and CSAN's own error class with and without accesses."""
    torch = pytest.importorskip("torch")
    from torch.cuda._sanitizer import Access, AccessType, UnsynchronizedAccessError

    from traingate.stages.concurrency.probe.cuda import NonBlockingWatch, StreamSanitizer
    from traingate.stages.harness.sites import SiteTable

    here = Path(__file__).resolve()
    watch = NonBlockingWatch()
    watch.available, watch.sites = True, SiteTable(here.parent)  # what install does on CUDA
    host = torch.zeros(4)
    watch.copied(host)
    watch.check_read(host, ".tolist()")
    payload = watch.collect()
    assert payload["copies"] == 1 and len(payload["races"]) == 1
    CONCURRENCY_MODELS[CONCURRENCY_NONBLOCKING].model_validate(payload)

    sanitizer = StreamSanitizer()
    sanitizer.available, sanitizer.sites = True, SiteTable(here.parent)
    stack = traceback.StackSummary.from_list([("/usr/lib/torch/x.py", 1, "outer", None), (str(here), 42, "overlap", None)])

    def access(stream: int, operator: str) -> Access:
        return Access(AccessType.WRITE, 1, stream, operator, ["out"], True, stack)

    sanitizer.record(UnsynchronizedAccessError(139, None, access(94_000_000_001, "aten::mul.out"), access(0, "aten::add_")))
    sanitizer.record(RuntimeError("an error without accesses"))
    payload = sanitizer.collect()
    assert [r["streams"] for r in payload["reports"]] == [[94_000_000_001, 0], [None, None]]
    assert payload["reports"][0]["site"]["line"] == 42 and payload["reports"][1]["site"] is None
    CONCURRENCY_MODELS[CONCURRENCY_STREAMS].model_validate(payload)


def test_a_cpu_watch_that_claims_an_observation_is_rejected() -> None:
    with pytest.raises(ValidationError, match="not installed"):
        CONCURRENCY_MODELS[CONCURRENCY_NONBLOCKING].model_validate({"available": False, "copies": 1, "races": []})
    with pytest.raises(ValidationError, match="not installed"):
        CONCURRENCY_MODELS[CONCURRENCY_STREAMS].model_validate({"available": False, "reports": [], "total": 2})
    with pytest.raises(ValidationError, match="at least"):
        CONCURRENCY_MODELS[CONCURRENCY_STREAMS].model_validate({"available": True, "reports": [STREAM_REPORT], "total": 0})


def test_loss_recorder_with_nan_and_unreadable_losses_past_the_detailed_steps_validates() -> None:
    """`LossTrace`'s own recording methods (called directly: installing would patch this
    process's torch), fed a NaN loss and one that `.item()` cannot read."""
    torch = pytest.importorskip("torch")
    from traingate.stages.concurrency.probe.trace import LossTrace

    class Unreadable:
        def numel(self) -> int:
            return 1

        def detach(self) -> Unreadable:
            return self

        def clone(self) -> Unreadable:
            return self

        def item(self) -> float:
            raise RuntimeError("no value")

    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD([{"params": [model.weight]}, {"params": [model.bias]}], lr=0.1)
    trace = LossTrace()
    for step in range(DETAILED_STEPS + 2):
        trace._on_backward([torch.tensor(float("nan")) if step == 0 else torch.tensor(float(step))])
        if step == 1:
            trace._on_backward([Unreadable()])
        trace._on_step(optimizer, (), {})
        trace.params._after_step(optimizer, (), {})
    payload = trace.collect()
    assert math.isnan(payload["losses"][0][0]) and payload["losses"][1][1] == "unreadable: RuntimeError"
    assert len(payload["params"]["steps"][-1]["groups"]) == 2
    CONCURRENCY_MODELS[CONCURRENCY_LOSSES].model_validate(payload)


def test_a_param_group_added_mid_run_is_fingerprinted_at_every_step() -> None:
    """Unfreezing a layer (`add_param_group`) after the first step: each step's group sums cover
    the groups of that step, before and past the detailed steps, and the target's step never
    fails inside the fingerprint hook."""
    torch = pytest.importorskip("torch")
    from traingate.stages.concurrency.probe.params import ParamFingerprints

    body, head = torch.nn.Linear(3, 3), torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.1)
    fingerprints = ParamFingerprints()
    for step in range(DETAILED_STEPS + 2):
        if step == 2:
            optimizer.add_param_group({"params": list(body.parameters())})
        fingerprints._after_step(optimizer, (), {})
    payload = fingerprints.collect()
    steps = payload["steps"]
    assert [len(s["groups"]) for s in (steps[1], steps[2], steps[-1])] == [1, 2, 2]
    unfrozen = steps[2]
    # The probe sums each parameter in float64: a float32 sum differs past the sixth digit for some draws.
    body_sum = sum(float(p.detach().sum(dtype=torch.float64)) for p in body.parameters())
    assert unfrozen["groups"][1][0] == pytest.approx(body_sum) and len(unfrozen["params"]) == 4
    CONCURRENCY_MODELS[CONCURRENCY_LOSSES].model_validate({"losses": [], "steps": len(steps), "truncated": False, "params": payload})


# -- wrong shapes: a malformed result -------------------------------------------------------------

SITE = {"path": "train.py", "line": 12, "function": "train", "code": "scaler.step(optimizer)"}
PARAMS = {
    "steps": [{"optimizer": 0, "groups": [[1.5, 2.0]], "params": [[1.0, 1.5], [0.5, 0.5]]}, {"optimizer": 0, "groups": [[1.25, 2.0]]}],
    "names": [["fc.weight", "fc.bias"]],
    "group_sizes": [[2]],
    "detailed_steps": 1,
    "dropped": 0,
}
LOSSES = {"losses": [[0.75], [0.5, 0.25]], "steps": 2, "truncated": False, "params": PARAMS}
TRACE = {
    **LOSSES,
    "events": [
        {"op": "scale", "site": 0, "scaler": 0, "enabled": True},
        {"op": "backward", "site": 0, "scaled_by": 0},
        {"op": "unscale_", "site": 0, "scaler": 0, "opt": 0, "enabled": True},
        {"op": "clip", "site": None, "fn": "clip_grad_norm_", "opts": [0]},
        {"op": "scaler.step", "site": 0, "scaler": 0, "opt": 0, "enabled": True, "stepped": True},
        {"op": "optimizer.step", "site": 0, "opt": 0, "via_scaler": True, "closure": False, "grads": True},
        {"op": "update", "site": 0, "scaler": 0, "enabled": True},
        {"op": "zero_grad", "site": 0, "opt": 0},
        {"op": "zero_grad", "site": 0, "module": "Linear"},
        {"op": "autograd.grad", "site": None},
    ],
    "dropped_events": 0,
    "sites": [SITE],
    "scalers": [{"index": 0, "type": "GradScaler", "enabled": True}],
    "optimizers": 1,
}
RNG = {"records": [{"api": "torch.Generator.seed()", "seed": 67280421310721, "entropy": True, "site": SITE}], "target_modules": ["train.py"]}
SETTINGS = {
    "num_workers": 2, "batch_size": 8, "sampler": "SequentialSampler", "persistent_workers": False, "prefetch_factor": 2,
    "pin_memory": False, "timeout": 0, "multiprocessing_context": None, "start_method": "fork", "generator": None,
    "dataset": "Rows", "collate_fn": "default_collate", "worker_init_fn": None,
}
LOADERS = {
    "loaders": [{"site": SITE, "settings": SETTINGS, "constructions": 1, "iterations": 1, "batches": 3, "live_workers": [2], "settings_vary": False}],
    "construction_errors": [{"site": None, "settings": {"num_workers": 0, "prefetch_factor": 2}, "type": "ValueError", "message": "prefetch_factor"}],
    "errors": [{"site": SITE, "settings": dict(SETTINGS), "type": "KeyError", "message": "Caught KeyError in DataLoader worker process 0", "kind": "worker-exception", "worker_site": None}],
    "start_method_checks": [
        {
            "site": SITE, "method": "spawn", "used": "fork",
            "pickle": {"ok": False, "object": "dataset", "error": "PicklingError: lambda", "culprit": {"attribute": "dataset.transform", "type": "function", "defined_at": SITE, "qualname": "<lambda>"}},
            "batch": {"ok": False, "error": "PicklingError: lambda", "kind": "other", "worker_site": None, "seconds": 1.25},
        },
        {"site": SITE, "method": "forkserver", "used": "fork", "pickle": {"ok": True}, "batch": {"ok": True, "seconds": 0.5, "same_as": SITE}},
    ],
}
NONBLOCKING = {"available": True, "copies": 3, "races": [{"copy_site": None, "read_site": SITE, "read_by": ".tolist()"}]}
STREAM_REPORT = {"message": "CSAN detected a possible data race", "site": SITE, "previous_site": None, "operator": "aten::mul.out", "previous_operator": "aten::add_", "streams": [7, 0]}
STREAMS = {"available": True, "reports": [STREAM_REPORT], "total": 1}

VALID = {
    CONCURRENCY_TRACE: TRACE,
    CONCURRENCY_LOSSES: LOSSES,
    CONCURRENCY_RNG: RNG,
    CONCURRENCY_LOADERS: LOADERS,
    CONCURRENCY_NONBLOCKING: NONBLOCKING,
    CONCURRENCY_STREAMS: STREAMS,
}

# Per instrument: a field an analysis reads given the wrong type, a required key left out,
# and a key no probe writes. A path is a list of keys and indices; its last item is the key.
KeyPath = list[str | int]
BROKEN: dict[str, dict[str, tuple[KeyPath, Any]]] = {
    CONCURRENCY_TRACE: {
        "wrong type": (["events", 2, "opt"], "the first one"),  # protocol.check does int(e["opt"])
        "missing": (["sites"], None),
        "unknown": (["events", 0, "loss_scale"], 65536.0),
    },
    CONCURRENCY_LOSSES: {
        "wrong type": (["losses", 1, 0], "0.5"),  # compared with its type: a string is no loss
        "missing": (["params", "steps", 0, "groups"], None),
        "unknown": (["params", "steps", 1, "names"], ["fc.weight"]),
    },
    CONCURRENCY_RNG: {
        "wrong type": (["records", 0, "site"], "train.py:12"),  # rng_causes reads site["path"]
        "missing": (["records", 0, "api"], None),
        "unknown": (["records", 0, "value"], 3),
    },
    CONCURRENCY_LOADERS: {
        "wrong type": (["loaders", 0, "constructions"], "once"),  # compared with 2
        "missing": (["start_method_checks", 0, "batch"], None),
        "unknown": (["loaders", 0, "settings", "workers"], 2),
    },
    CONCURRENCY_NONBLOCKING: {
        "wrong type": (["races", 0, "read_site"], None),  # the finding reads read["path"]
        "missing": (["copies"], None),
        "unknown": (["pending"], 1),
    },
    CONCURRENCY_STREAMS: {
        "wrong type": (["reports", 0, "streams"], "7 vs 0"),
        "missing": (["total"], None),
        "unknown": (["reports", 0, "kernel"], "mul"),
    },
}


def broken(spec: str, how: str) -> dict[str, Any]:
    """VALID[spec] with one change: `how` is "missing" (the key removed) or sets the value."""
    payload = copy.deepcopy(VALID[spec])
    path, value = BROKEN[spec][how]
    holder: Any = payload
    for key in path[:-1]:
        holder = holder[key]
    if how == "missing":
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return payload


def harness_result(payloads: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return {"ok": True, "phase": "call", "exception": None, "returned": None, "duration_s": 0.5, "warnings": [], "instruments": payloads}


def test_the_valid_payloads_validate_together() -> None:
    record = HarnessResult.model_validate(harness_result(copy.deepcopy(VALID)), context=READ_BY_STAGE)
    assert record.instruments == VALID  # validation only: the analyses read the dicts as sent


@pytest.mark.parametrize("how", ["wrong type", "missing", "unknown"])
@pytest.mark.parametrize("spec", CONCURRENCY)
def test_a_payload_of_the_wrong_shape_makes_the_result_malformed(spec: str, how: str) -> None:
    with pytest.raises(ValidationError) as raised:
        HarnessResult.model_validate(harness_result({spec: broken(spec, how)}), context=READ_BY_STAGE)
    # Each error points at the broken field (a union adds the member it tried to the path).
    path = BROKEN[spec][how][0]
    for error in raised.value.errors():
        loc = iter(error["loc"])
        assert error["loc"][:2] == ("instruments", spec) and all(key in loc for key in path), error


def test_an_unknown_protocol_call_is_rejected() -> None:
    payload = copy.deepcopy(TRACE)
    payload["events"].append({"op": "scaler.scale", "site": 0, "scaler": 0, "enabled": True})
    with pytest.raises(ValidationError, match="scaler.scale"):
        HarnessResult.model_validate(harness_result({CONCURRENCY_TRACE: payload}), context=READ_BY_STAGE)


def test_an_instrument_that_raised_is_handed_on_for_the_stage_to_report() -> None:
    record = HarnessResult.model_validate(harness_result({CONCURRENCY_LOADERS: {"error": "Traceback ..."}}), context=READ_BY_STAGE)
    assert record.instruments[CONCURRENCY_LOADERS] == {"error": "Traceback ..."}


# -- failing closed -------------------------------------------------------------------------------


def _sent_over_the_channel(body: dict[str, Any]) -> tuple[bytes, str]:
    """`body` as the harness's channel writer puts it on the wire, and the run's nonce."""
    nonce = new_nonce()
    read_end, write_end = os.pipe()
    writer = ChannelWriter(ChannelSpec(fd=write_end, nonce=nonce))
    writer.send(HARNESS_RESULT, body)
    writer.close()
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    return b"".join(chunks), nonce


def test_the_stage_reports_a_malformed_payload_as_a_blocking_stage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The instrumented run hands back a loader payload missing a key: the result is read as
    the gate reads every child's (`read_harness_result`), and the stage fails closed."""
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        def train(steps):
            return steps
    """))
    payloads = {**copy.deepcopy(VALID), CONCURRENCY_LOADERS: broken(CONCURRENCY_LOADERS, "missing")}
    del payloads[CONCURRENCY_LOSSES], payloads[CONCURRENCY_NONBLOCKING], payloads[CONCURRENCY_STREAMS]
    runs: list[str] = []

    def instrumented_run(ctx: StageContext, *, label: str, **_: Any) -> EntrypointRun:
        runs.append(label)
        wire, nonce = _sent_over_the_channel(harness_result(payloads))
        child = ChildResult(argv=["harness"], returncode=0, timed_out=False, duration_s=0.5, stdout="", stderr="", channel=wire)
        record, problem = read_harness_result(child, nonce, models=ctx.payload_models)
        return EntrypointRun(child=child, result=record.model_dump(mode="json") if record is not None else None, channel_problem=problem)

    monkeypatch.setattr(concurrency_stage, "run_entrypoint", instrumented_run)
    outcome = ConcurrencyStage().run(_context(tmp_path, tmp_path / "scratch", steps=2))
    assert runs == ["instrumented"]  # no rerun on a result that cannot be trusted
    [finding] = outcome.findings
    assert finding.category.value == "stage-error" and finding.blocking
    assert "malformed result" in finding.evidence.summary
    assert "start_method_checks" in finding.evidence.summary and "batch" in finding.evidence.summary
