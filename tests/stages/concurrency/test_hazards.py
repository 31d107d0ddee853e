"""Findings that point at the fix, and no false blocks on clean training code:
- an object a DataLoader cannot pickle for `spawn` is found where it is defined;
- determinism is judged on the losses and the parameters after each optimizer step, and a
  difference only in returned values (wall-clock times) never blocks;
- `amp-inactive` on a CPU is not applicable when the code enables AMP only on CUDA.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TARGETS, line_of, run_gate
from traingate.pipeline.supervision.isolation import ChildResult
from traingate.stages.base import EntrypointRun
from traingate.pipeline.model.returned import comparable_leaves, without_volatile_text
from traingate.stages.concurrency.determinism import RunData, compare
from traingate.stages.concurrency.loaders import _start_method_groups
from traingate.stages.concurrency.probe.loaders import _innermost_unpicklable
from traingate.stages.concurrency.probe.payloads import ParamFingerprints, StartMethodCheck
from traingate.stages.performance.amp import amp_flag_names, cuda_only_gate


# -- the object that cannot be pickled -------------------------------------------------------------

class _Holder:
    def __init__(self, transform: Any) -> None:
        self.size = 4
        self.pipeline = {"steps": [abs, transform]}


def test_the_walk_names_the_innermost_unpicklable_object() -> None:
    local = lambda t: t  # noqa: E731 - a local lambda is the case under test
    path, culprit = _innermost_unpicklable(_Holder(local), "dataset")
    assert path == "dataset.pipeline['steps'][1]" and culprit is local
    partial_path, partial_culprit = _innermost_unpicklable(functools.partial(max, key=local), "collate_fn")
    assert partial_path == "collate_fn.keywords['key']" and partial_culprit is local


def _site(line: int, code: str = "DataLoader(rows, num_workers=2)") -> dict[str, Any]:
    return {"path": "train.py", "line": line, "function": "train", "code": code}


def _failed_check(loader_line: int, culprit_line: int | None, method: str = "spawn") -> StartMethodCheck:
    culprit = {"attribute": "dataset.transform", "type": "function", "defined_at": _site(culprit_line, "t = lambda x: x") if culprit_line else None, "qualname": "<lambda>"}
    return StartMethodCheck.model_validate({
        "site": _site(loader_line),
        "method": method,
        "used": "fork",
        "pickle": {"ok": False, "object": "dataset", "error": "AttributeError: Can't pickle local object", "culprit": culprit},
        "batch": {"ok": False, "error": "AttributeError: Can't pickle local object", "kind": "other", "worker_site": None, "seconds": 1.0},
    })


def test_loaders_broken_by_one_object_are_one_group() -> None:
    ok = StartMethodCheck.model_validate({"site": _site(30), "method": "spawn", "used": "fork", "batch": {"ok": True, "seconds": 1.0}})
    groups = _start_method_groups([_failed_check(20, 10), _failed_check(21, 10), ok, _failed_check(40, 35)])
    assert [[c.site.line if c.site else None for c in g] for g in groups] == [[20, 21], [40]]


# -- determinism on what training computes ----------------------------------------------------------

def _run(losses: list[list[float]], params: list[dict[str, Any]], returned: Any) -> RunData:
    child = ChildResult(argv=[], returncode=0, timed_out=False, duration_s=1.0, stdout="", stderr="")
    result = {"ok": True, "phase": "call", "returned": returned, "exception": None, "duration_s": 1.0}
    fingerprints = {"steps": params, "names": [["fc.weight", "fc.bias"]], "group_sizes": [[2]], "detailed_steps": len(params), "dropped": 0}
    return RunData("run", "0", EntrypointRun(child=child, result=result), losses, None, ParamFingerprints.model_validate(fingerprints))


def _step(weight: float, bias: float) -> dict[str, Any]:
    return {"optimizer": 0, "groups": [[weight + bias, 2.0]], "params": [[weight, 1.0], [bias, 1.0]]}


def test_the_first_parameter_that_differs_is_named_with_its_step() -> None:
    a = _run([[1.0], [0.5]], [_step(0.1, 0.2), _step(0.3, 0.4)], {"loss": 0.5})
    b = _run([[1.0], [0.5]], [_step(0.1, 0.2), _step(0.3, 0.45)], {"loss": 0.5})
    divergence = compare(a, b)
    assert divergence is not None and (divergence.where, divergence.step, divergence.key) == ("parameters", 1, "fc.bias")
    assert "optimizer step 2" in divergence.describe() and "fc.bias" in divergence.describe()


def test_time_like_fields_and_columns_are_left_out_of_returned_values() -> None:
    text, ignored = without_volatile_text("EpochMetrics(epoch=0, loss=0.5, epoch_duration=1.25)")
    assert text == "EpochMetrics(epoch=0, loss=0.5, epoch_duration=…)" and ignored == ["epoch_duration"]
    table, columns = without_volatile_text("loss epoch_duration\n0 0.5 1.25\n1 0.25 0.75")
    assert table == "loss\n0 0.5\n1 0.25" and columns == ["epoch_duration"]
    kept, ignored = comparable_leaves({"history": ["M(loss=1.0, elapsed_s=3)"], "samples_per_sec": 9.0, "loss": 1.0})
    assert kept == {"history": ["M(loss=1.0, elapsed_s=…)"], "loss": 1.0}
    assert sorted(ignored) == ["history[].elapsed_s", "samples_per_sec"]
    # A value that is not time-like still counts.
    assert not same_text("M(loss=1.0)", "M(loss=2.0)")


def same_text(a: str, b: str) -> bool:
    return without_volatile_text(a)[0] == without_volatile_text(b)[0]


@pytest.mark.slow
def test_wallclock_metrics_in_the_returned_value_pass(tmp_path: Path) -> None:
    run = run_gate(TARGETS / "conc_wallclock_metrics", tmp_path / "out", "--stages", "concurrency", timeout=300)
    assert run.returncode == 0 and run.report["decision"] == "PASS", run.stdout + run.stderr
    assert not [f for f in run.findings() if f["blocking"]]
    determinism = run.stage("concurrency")["details"]["checks"]["determinism"]
    assert determinism["verdict"].startswith("identical")
    assert "history[].epoch_duration" in determinism["returned_ignored"] and "metrics_summary.epoch_duration" in determinism["returned_ignored"]


# -- amp-inactive where the code enables AMP only on CUDA -------------------------------------------

def test_a_cuda_only_amp_switch_is_found_in_the_source(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("import torch\n\ndef run(cfg):\n    amp = cfg.use_amp and device.type == 'cuda'\n    return amp\n")
    gate = cuda_only_gate(tmp_path, {"use_amp"}, ["train.py"])
    assert gate is not None and (gate.path, gate.line) == ("train.py", 4) and "device.type == 'cuda'" in gate.code
    (tmp_path / "train.py").write_text("def run(use_amp, fast):\n    return use_amp and fast\n")
    assert cuda_only_gate(tmp_path, {"use_amp"}, ["train.py"]) is None
    assert amp_flag_names("amp_args", ["--mixed-precision", "bf16"]) == {"mixed_precision"}


@pytest.mark.slow
def test_amp_enabled_only_on_cuda_is_not_applicable_on_cpu(tmp_path: Path) -> None:
    target = TARGETS / "perf_amp_cuda_only"
    run = run_gate(target, tmp_path / "out", "--stages", "performance", "--device", "cpu", timeout=300)
    assert run.returncode == 0 and run.report["decision"] == "PASS", run.stdout + run.stderr
    assert not run.findings("amp-inactive")
    metrics = {m["id"]: m for m in run.stage("performance")["metrics"]}
    note = metrics["amp.active"]["note"]
    assert note.startswith("not applicable on cpu") and f"train.py:{line_of(target / 'train.py', 'marker: cuda-only-gate')}" in note
    assert "--device cuda" in note
