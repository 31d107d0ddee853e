"""The correctness instruments' payload models (`traingate.stages.correctness.probe.payloads`).

What the probes really hand back is captured by running the harness (`entrypoint.run`) in a
fresh interpreter on a small training function (the probes patch torch for the rest of the
process), with the instruments of each of the stage's runs; it must validate, on every path:
non-finite losses and weights, a step that raises inside `step()`, a run without a step.
Then, for each instrument, a wrong type in a field the analysis reads, a missing key and an
unknown key must each make the harness result malformed, and the stage fails closed on one.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tests.harness_runs import run_requests
from traingate.stages.correctness.probe.payloads import CORRECTNESS_FIRST_UPDATE as FIRST_UPDATE, CORRECTNESS_GRADIENTS as GRADIENTS, CORRECTNESS_LOADERS as LOADERS, CORRECTNESS_LOSSES as LOSSES, CORRECTNESS_MODES as MODES, CORRECTNESS_ONE_BATCH as ONE_BATCH, CORRECTNESS_RANKS as RANKS, CORRECTNESS_STEPS as STEPS
from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.supervision.isolation import ChildResult
from traingate.stages.base import EntrypointRun, StageContext, read_harness_result
from traingate.stages.contract import instruments
from traingate.stages.common.channel import ChannelSpec
from traingate.stages.contract.messages import HARNESS_RESULT, EntrypointRequest, HarnessResult, RankResult
from traingate.stages.correctness.probe.payloads import FirstUpdatePayload, OneBatchPayload
from traingate.stages.correctness import stage as correctness_stage
from traingate.stages.harness.entrypoint import as_sent, collect_payload
from traingate.stages.contract.messages import MODELS_CONTEXT
from traingate.stages.correctness.probe.payloads import MODELS

# A result read as the parent reads it: against the stage's payload models.
READ_BY_STAGE = {MODELS_CONTEXT: MODELS}

CORRECTNESS = [STEPS, LOSSES, LOADERS, FIRST_UPDATE, ONE_BATCH, RANKS, GRADIENTS, MODES]

TARGET = '''
import torch
from torch.utils.data import DataLoader, TensorDataset


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(4, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.unused = torch.nn.Linear(4, 1)  # in the optimizer, never in the forward

    def forward(self, x):
        return self.norm(self.body(x)).sum(dim=1, keepdim=True)


class FailingSGD(torch.optim.SGD):
    def step(self, closure=None):
        raise RuntimeError("this optimizer cannot step")


def train(epochs: int = 2, overflow: bool = True, fail_step: bool = False) -> None:
    torch.manual_seed(0)
    model = Net()
    head = torch.nn.Linear(4, 1)  # trained through the loss, held by no optimizer
    optimizer = (FailingSGD if fail_step else torch.optim.SGD)(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.0 if step == 0 else 1.0)
    loader = DataLoader(TensorDataset(torch.randn(32, 4), torch.randn(32, 1)), batch_size=8)
    for epoch in range(epochs):
        for index, (x, y) in enumerate(loader):
            loss = torch.nn.functional.mse_loss(model(x) + head(x), y)
            if overflow and epoch == epochs - 1 and index == len(loader) - 1:
                loss = loss * float("inf")  # the last step turns the weights non-finite
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            warmup.step()
'''


RUNS: dict[str, dict[str, Any]] = {
    "instrumented": {"instruments": [STEPS, LOSSES, LOADERS, RANKS, GRADIENTS, MODES], "kwargs": {}},
    "first-update": {"instruments": [FIRST_UPDATE, LOSSES], "kwargs": {"epochs": 1, "overflow": False}},
    "one-batch": {"instruments": [ONE_BATCH, LOSSES], "kwargs": {"overflow": False}, "options": {"correctness": {"overfit_steps": 3}}},
    "no-step": {"instruments": CORRECTNESS, "kwargs": {"epochs": 0}},
    "failing-step": {"instruments": CORRECTNESS, "kwargs": {"fail_step": True}},
}


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each run's harness result, as the parent reads it off the channel (JSON-decoded)."""
    root = tmp_path_factory.mktemp("payload_target")
    (root / "train.py").write_text(textwrap.dedent(TARGET))
    requests = []
    for label, run in RUNS.items():
        request = EntrypointRequest(
            target_root=str(root), call="train:train", setup=None, kwargs=run["kwargs"], amp_flag=None, amp=None, seed=0, device="cpu",
            instruments=run["instruments"], instrument_options=run.get("options", {}), deterministic=False, channel=ChannelSpec(fd=-1, nonce="unused"),
        )
        requests.append((request.model_dump_json(), str(root / f"{label}.json")))
    run_requests(root, requests)
    return {label: json.loads((root / f"{label}.json").read_text(encoding="utf-8")) for label in RUNS}


def payloads(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = result["instruments"]
    assert not [spec for spec, payload in found.items() if instruments.ERROR_KEY in payload], found
    return found


@pytest.mark.parametrize("label", list(RUNS))
def test_every_run_of_the_probes_hands_back_a_valid_result(captured: dict[str, dict[str, Any]], label: str) -> None:
    result = HarnessResult.model_validate(captured[label], context=READ_BY_STAGE)
    assert sorted(result.instruments) == sorted(RUNS[label]["instruments"])


def test_the_instrumented_run_validates_with_non_finite_losses_and_weights(captured: dict[str, dict[str, Any]]) -> None:
    found = payloads(captured["instrumented"])
    steps, losses, loaders, ranks = found[STEPS], found[LOSSES], found[LOADERS], found[RANKS]
    # The paths the models must accept were taken: a zero-lr step with its scheduler, a
    # parameter without a gradient, one outside the optimizer, weights ending non-finite.
    assert steps["steps"] == 8 and steps["ineffective"][0]["lrs"] == [0.0]
    assert steps["ineffective"][0]["schedulers"][0]["class"] == "LambdaLR"
    assert {p["name"] for p in steps["no_gradient"]} == {"unused.weight", "unused.bias"}
    assert {p["name"] for p in steps["not_in_optimizer"]} == {"weight", "bias"} and steps["non_finite_params"]
    assert losses["calls"] == 8 and losses["last_non_finite"] is True and losses["losses"][-1] in ("inf", "nan")
    assert losses["first_non_finite"]["value"] in ("inf", "nan") and len(losses["first_finite"]) == 1
    [loader] = loaders["loaders"]
    assert (loader["sampler"], loader["epochs"], loader["steps"], loader["length"]) == ("SequentialSampler", 2, 8, 4)
    assert any(v in ("nan", "inf", "-inf") for t in ranks["tensors"] for v in t["values"])
    assert {t["kind"] for t in ranks["tensors"]} == {"parameter", "buffer"} and ranks["seeds"][0]["seed"] == 0
    assert len(ranks["loaders"][0]["digests"]) == 8 and set(ranks["initial"]) <= {t["name"] for t in ranks["tensors"]}


def test_the_gradient_and_mode_probes_validate_on_the_instrumented_run(captured: dict[str, dict[str, Any]]) -> None:
    found = payloads(captured["instrumented"])
    gradients, modes = found[GRADIENTS], found[MODES]
    # zero_grad() before every backward: 7 steps judged after the first, none stale.
    assert (gradients["steps"], gradients["judged"], gradients["stale_count"]) == (8, 7, 0)
    # The BatchNorm ran in train mode with gradients every time: applicable, nothing found.
    assert (modes["dependent_modules"], modes["classes"], modes["eval_while_training"], modes["train_under_no_grad"]) == (1, ["BatchNorm1d"], [], [])


def test_the_accumulation_and_overfit_runs_validate(captured: dict[str, dict[str, Any]]) -> None:
    update = payloads(captured["first-update"])[FIRST_UPDATE]
    assert captured["first-update"]["exception"]["type"] == update["stop"] == "FirstStepReached"
    assert update["stepped"] is True and all("update_norm" in p for p in update["params"])
    assert [p["grad_norm"] is None for p in update["params"]] == [False, False, False, False, True, True]  # `unused` has no gradient
    one_batch = payloads(captured["one-batch"])[ONE_BATCH]
    assert captured["one-batch"]["exception"]["type"] == one_batch["stop"] == "OverfitStepsDone"
    assert (one_batch["steps"], one_batch["limit"], one_batch["loaders"], one_batch["batches_repeated"]) == (3, 3, 1, 2)


def test_runs_without_a_completed_step_validate(captured: dict[str, dict[str, Any]]) -> None:
    empty = payloads(captured["no-step"])
    assert empty[STEPS]["steps"] == 0 and empty[FIRST_UPDATE] == {"stepped": False, "params": [], "stop": "FirstStepReached"}
    assert empty[LOSSES]["first_non_finite"] is None and empty[RANKS]["initial"] == {}
    failed = payloads(captured["failing-step"])
    assert captured["failing-step"]["exception"]["type"] == "RuntimeError"
    # The pre-step hook recorded the gradients; step() raised before the update was written.
    update = failed[FIRST_UPDATE]
    assert update["stepped"] is False and update["params"] and not any("update_norm" in p for p in update["params"])


# -- malformed payloads ----------------------------------------------------------------------------

SITE = {"path": "train.py", "line": 12, "function": "train", "code": "optimizer.step()"}
DESCRIBED = {"name": "unused.weight", "root": "Net", "root_site": 0, "module": "Linear", "site": 0, "shape": [1, 4]}
DIGEST = "0123456789abcdef0123456789abcdef"
VALID: dict[str, dict[str, Any]] = {
    STEPS: {
        "steps": 2,
        "optimizers": [{"class": "SGD", "groups": [{"lr": 0.1, "params": 2}]}],
        "ineffective": [{"step": 0, "optimizer": 0, "site": 0, "lrs": [0.0], "schedulers": [{"class": "LambdaLR", "site": 0}], "grads_present": 2, "params": 2}],
        "ineffective_count": 1,
        "step_sites": [{"site": 0, "steps": 2}],
        "not_in_optimizer": [{**DESCRIBED, "name": None, "root": None, "root_site": None, "module": None, "site": None}],
        "not_in_optimizer_count": 1,
        "no_gradient": [{**DESCRIBED, "optimizer": 0, "group": 0, "lr": 0.1}],
        "no_gradient_count": 1,
        "never_changed": [],
        "never_changed_count": 0,
        "modules_seen": 2,
        "non_finite_params": [],
        "sites": [SITE],
    },
    LOSSES: {
        "calls": 3, "dropped": 0, "steps": 3, "non_finite": 1, "first_non_finite": {"call": 2, "step": 2, "site": 0, "value": "nan"},
        "first_finite": [1.5], "last_non_finite": True, "losses": [1.5, None, "nan"], "steps_of_calls": [0, 1, 2], "backward_sites": [0], "sites": [SITE],
    },
    LOADERS: {
        "loaders": [
            {
                "site": 0, "epochs": 2, "batches": 8, "steps": 8, "sampler": "SequentialSampler", "sampler_module": "torch.utils.data.sampler",
                "batch_sampler": "BatchSampler", "sampler_shuffles": False, "set_epoch_calls": 0, "length": 4, "iterable_dataset": False,
            }
        ],
        "sites": [SITE],
    },
    FIRST_UPDATE: {
        "stepped": True,
        "params": [{"group": 0, "numel": 4, "grad_norm": 0.5, "grad_sample": [0.25, 0.25], "update_norm": 0.05, "update_sample": [0.025, 0.025]}],
        "stop": "FirstStepReached",
    },
    ONE_BATCH: {"steps": 3, "limit": 3, "loaders": 1, "batches_repeated": 2, "stop": "OverfitStepsDone"},
    RANKS: {
        "steps": 4,
        "tensors": [
            {"name": "Net[0].body.weight", "kind": "parameter", "module": "Linear", "site": 0, "module_site": 0, "in_ddp": True,
             "shape": [2], "digest": DIGEST, "values": [0.5, "nan"], "sampled": False, "numel": 2}
        ],
        "initial": {"Net[0].body.weight": DIGEST},
        "ddp": [{"site": 0, "module": "Net", "broadcast_buffers": True}],
        "seeds": [{"site": 0, "seed": 1234}],
        "loaders": [{"site": 0, "sampler": "DistributedSampler", "batches": 4, "steps": 4, "digests": [DIGEST]}],
        "sites": [SITE],
    },
    GRADIENTS: {
        "steps": 3, "judged": 2, "dropped": 0, "stale_count": 2, "largest_share": 0.8, "sites": [SITE],
        "stale": [{"step": 1, "optimizer": 0, "site": 0, "backward_site": 0, "carried_norm": 0.4, "applied_norm": 0.5, "carried_share": 0.8, "params_carrying": 2, "params": 2}],
    },
    MODES: {
        "steps": 4, "dependent_modules": 2, "classes": ["BatchNorm1d", "Dropout"], "frozen_on_purpose": 0, "library_calls": 0, "sites": [SITE],
        "eval_while_training": [
            {"site": 0, "root": "Net", "modules": [{"name": "drop", "class": "Dropout", "kind": "dropout"}], "first_step": 2, "steps": 2, "step_indexes": [2, 3], "step_site": 0, "eval_site": 0}
        ],
        "train_under_no_grad": [
            {"site": 0, "root": "Net", "modules": [{"name": "norm", "class": "BatchNorm1d", "kind": "norm"}], "first_step": 1, "forwards": 2, "inference_mode": False}
        ],
    },
}

# Per instrument: (path to a field its analysis reads, a value of the wrong type), and a
# required key to leave out (a path ending in the key).
WRONG_TYPE: dict[str, tuple[tuple[Any, ...], Any]] = {
    STEPS: (("ineffective", 0, "lrs"), 0.0),  # ineffective.py iterates it
    LOSSES: (("losses", 0), "1.5 or so"),  # nonfinite.py and overfit.py add them up
    LOADERS: (("loaders", 0, "length"), "four"),  # shuffling.py compares it with 1
    FIRST_UPDATE: (("params", 0, "grad_sample"), [[0.25], [0.25]]),  # accumulation.py subtracts them
    ONE_BATCH: (("batches_repeated",), [2]),  # the stage tests it
    RANKS: (("tensors", 0, "kind"), "weight"),  # divergence.py selects parameters by it
    GRADIENTS: (("stale", 0, "carried_share"), "most"),  # stale.py formats it as a number
    MODES: (("train_under_no_grad", 0, "modules", 0, "kind"), "batchnorm"),  # modes.py tells norm layers by it
}
MISSING: dict[str, tuple[Any, ...]] = {
    STEPS: ("never_changed_count",),
    LOSSES: ("first_non_finite",),
    LOADERS: ("loaders", 0, "sampler"),
    FIRST_UPDATE: ("params", 0, "numel"),
    ONE_BATCH: ("steps",),
    RANKS: ("tensors", 0, "digest"),
    GRADIENTS: ("stale", 0, "backward_site"),
    MODES: ("eval_while_training", 0, "eval_site"),
}


def harness_result(spec: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A HarnessResult around one payload; a distributed one, with it in a rank, for RANKS."""
    result = {"ok": True, "phase": "call", "exception": None, "returned": None, "duration_s": 1.0, "warnings": [], "instruments": {spec: payload}}
    if spec != RANKS:
        return result
    ranks = [
        {"rank": rank, "pid": 100 + rank, "ending": "returned", "reported": True, "ok": True, "phase": "call", "exception": None, "duration_s": 1.0, "instruments": {spec: payload}}
        for rank in range(2)
    ]
    distributed = {"nproc": 2, "backend": "gloo", "start_method": "fork", "timeout_s": 60.0, "timed_out": False, "launcher_error": None, "duration_s": 2.0, "ranks": ranks}
    return {**result, "instruments": {}, "distributed": distributed}


def changed(payload: dict[str, Any], path: tuple[Any, ...], value: Any = None, *, remove: bool = False) -> dict[str, Any]:
    copied = copy.deepcopy(payload)
    holder: Any = copied
    for step in path[:-1]:
        holder = holder[step]
    if remove:
        del holder[path[-1]]
    else:
        holder[path[-1]] = value
    return copied


def test_every_correctness_instrument_has_a_model() -> None:
    assert set(CORRECTNESS) <= set(MODELS) and set(VALID) == set(CORRECTNESS)


@pytest.mark.parametrize("spec", CORRECTNESS)
def test_a_well_formed_payload_validates(spec: str) -> None:
    HarnessResult.model_validate(harness_result(spec, VALID[spec]), context=READ_BY_STAGE)


def records(payload: dict[str, Any]) -> list[str]:
    """The payload's keys holding a list of records."""
    return [key for key, value in payload.items() if isinstance(value, list) and value and isinstance(value[0], dict)]


@pytest.mark.parametrize("spec", CORRECTNESS)
@pytest.mark.parametrize("fault", ["wrong-type", "missing-key", "unknown-key"])
def test_a_malformed_payload_makes_the_result_malformed(spec: str, fault: str) -> None:
    valid = VALID[spec]
    if fault == "wrong-type":
        path, value = WRONG_TYPE[spec]
        payload = changed(valid, path, value)
    elif fault == "missing-key":
        payload = changed(valid, MISSING[spec], remove=True)
    else:
        payload = {**valid, "extra": 1}
    with pytest.raises(ValidationError):
        HarnessResult.model_validate(harness_result(spec, payload), context=READ_BY_STAGE)


@pytest.mark.parametrize(("spec", "key"), [(spec, key) for spec in CORRECTNESS for key in records(VALID[spec])])
def test_a_record_with_an_unknown_key_makes_the_result_malformed(spec: str, key: str) -> None:
    with pytest.raises(ValidationError):
        HarnessResult.model_validate(harness_result(spec, changed(VALID[spec], (key, 0, "extra"), 1)), context=READ_BY_STAGE)


@pytest.mark.parametrize(
    ("spec", "path", "value"),
    [
        (LOSSES, ("first_non_finite", "value"), "NaN"),  # non-finite losses are written as repr()
        (FIRST_UPDATE, ("stop",), "OverfitStepsDone"),  # the stage matches the exception's name
        (RANKS, ("tensors", 0, "digest"), "w"),  # a 16-byte BLAKE2b digest in hex
        (STEPS, ("step_sites", 0, "site"), None),  # only steps made from the target's lines are counted by line
    ],
)
def test_values_outside_what_the_probe_writes_are_rejected(spec: str, path: tuple[Any, ...], value: Any) -> None:
    with pytest.raises(ValidationError):
        HarnessResult.model_validate(harness_result(spec, changed(VALID[spec], path, value)), context=READ_BY_STAGE)


def test_a_failed_collect_is_passed_through_for_the_stage_to_report() -> None:
    error = {instruments.ERROR_KEY: "Traceback (most recent call last): ..."}
    assert HarnessResult.model_validate(harness_result(STEPS, error), context=READ_BY_STAGE).instruments[STEPS] == error


# -- built where they are made: each probe's collect() builds its model, the harness its result -----


@pytest.mark.parametrize("spec", CORRECTNESS)
def test_a_payload_built_by_its_model_is_handed_back_as_written(spec: str) -> None:
    # The keys and values the probe gave, no more (a default it left out stays out); `class`
    # by its wire name.
    assert MODELS[spec].sent(copy.deepcopy(VALID[spec])) == VALID[spec]


def test_a_built_payload_keeps_non_finite_floats_for_the_harness_to_write() -> None:
    # The run ended inside step(): no update_norm, and the model's default does not add one.
    params = [{"group": 0, "numel": 2, "grad_norm": math.inf, "grad_sample": [math.nan, -math.inf]}]
    sent = FirstUpdatePayload.sent({"stepped": False, "params": params, "stop": "FirstStepReached"})
    assert json.dumps(sent["params"]) == '[{"group": 0, "numel": 2, "grad_norm": Infinity, "grad_sample": [NaN, -Infinity]}]'


def test_a_probe_whose_data_does_not_fit_its_model_is_reported_as_a_failed_collect() -> None:
    class Drifted:
        def collect(self) -> dict[str, Any]:
            return OneBatchPayload.sent({**VALID[ONE_BATCH], "batches_repeated": "two"})

    payload = collect_payload(ONE_BATCH, Drifted())
    error = instruments.collect_error(payload)
    assert error is not None and "ValidationError" in error and "batches_repeated" in error
    assert HarnessResult.model_validate(harness_result(ONE_BATCH, payload), context=READ_BY_STAGE).instruments[ONE_BATCH] == payload


def test_the_harness_sends_its_result_as_its_model_dumps_it() -> None:
    fields = harness_result(ONE_BATCH, VALID[ONE_BATCH])
    assert as_sent(fields) == fields  # returned_truncated and warnings_omitted: not set, not sent
    # A payload changed after its model built it goes as it is: the parent rejects the result.
    tampered = harness_result(ONE_BATCH, {**VALID[ONE_BATCH], "steps": "many"})
    sent = as_sent(tampered)
    assert sent["instruments"] == tampered["instruments"]
    with pytest.raises(ValidationError, match="steps"):
        HarnessResult.model_validate(sent, context=READ_BY_STAGE)


def test_the_payload_models_cost_a_child_nothing_at_start_up() -> None:
    # The harness imports every instrument before the target runs; the probes import their
    # models inside collect(), so a child pays for them once the target's code has run.
    from traingate.stages.concurrency.probe.payloads import MODELS as CONCURRENCY_MODELS
    from traingate.stages.performance.probe.payloads import MODELS as PERFORMANCE_MODELS

    every = [*PERFORMANCE_MODELS, *CONCURRENCY_MODELS, *MODELS]
    probes = sorted({spec.partition(":")[0] for spec in every})
    code = "import sys, traingate.stages.harness.entrypoint\n" + "".join(f"import {m}\n" for m in probes)
    code += "print(sorted(m for m in sys.modules if m.startswith('traingate.stages.contract.payloads') or m.endswith('.probe.payloads')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_collective_calls_of_a_rank_are_typed() -> None:
    call = {"function": "all_reduce", "path": "train.py", "line": 30, "target_function": "train", "code": "dist.all_reduce(t)", "calls": 3}
    rank = {"rank": 1, "pid": None, "ending": "still running at the timeout", "reported": False, "ok": False, "phase": None, "exception": None, "duration_s": None}
    assert RankResult.model_validate({**rank, "collectives": [call]}).model_dump(mode="json")["collectives"] == [call]
    for bad in ({**call, "calls": 0}, {**call, "line": "thirty"}, {k: v for k, v in call.items() if k != "calls"}, {**call, "rank": 1}):
        with pytest.raises(ValidationError):
            RankResult.model_validate({**rank, "collectives": [bad]})


def test_the_stage_fails_closed_on_a_malformed_payload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    nonce = "0123456789abcdef"
    body = harness_result(STEPS, changed(VALID[STEPS], MISSING[STEPS], remove=True))
    envelope = json.dumps({"nonce": nonce, "seq": 0, "kind": HARNESS_RESULT, "body": body}) + "\n"
    child = ChildResult(argv=["harness"], returncode=0, timed_out=False, duration_s=1.0, stdout="", stderr="", channel=envelope.encode())
    assert read_harness_result(child, nonce)[0] is not None  # read without the stage's models: nothing to check it against
    record, problem = read_harness_result(child, nonce, models=MODELS)
    assert record is None and problem is not None and problem.startswith("a malformed result")
    assert "never_changed_count" in problem

    def instrumented_run(*args: Any, **kwargs: Any) -> EntrypointRun:
        return EntrypointRun(child=child, result=None, channel_problem=problem)

    monkeypatch.setattr(correctness_stage, "run_entrypoint", instrumented_run)
    config = TargetConfig(entrypoint=EntrypointConfig(call="train:train"))
    ctx = StageContext(stage="correctness", root=tmp_path, config=config, device="cpu", deadline=time.time() + 60, scratch=tmp_path / "scratch")
    outcome = correctness_stage.CorrectnessWork().run(ctx)
    [finding] = outcome.findings
    assert finding.category.value == "stage-error" and finding.blocking is True
    assert finding.evidence.data["reason"] == "no-result"
    assert "observed" not in outcome.details["checks"]  # no analysis read the rejected payload
