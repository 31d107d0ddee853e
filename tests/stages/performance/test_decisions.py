"""The performance stage's decisions on hand-made measurements: no processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from traingate.pipeline.model.schema import Metric, Severity
from traingate.stages.performance import amp as perf_amp, memory as perf_memory, regression as perf_regression, sync as perf_sync, timing as perf_timing
from traingate.stages.performance.config import PerformancePolicy
from traingate.stages.performance.probe.payloads import AmpCounts, SyncRecords
from traingate.stages.performance.spec import PerformanceStage
from traingate.stages.performance.stage import analyse
from tests.stages.performance.measurements import baseline_with, clock, full_payload, make_ctx, memory_record, quiet_timings


def test_step_time_regression_beyond_noise_is_reported(tmp_path: Path) -> None:
    base = baseline_with([{"id": "step_time.median.default", "name": "step time, median (default)", "value": 10.0}, {"id": "step_time.iqr.default", "name": "step time, IQR (default)", "value": 0.5}])
    now = [Metric(id="step_time.median.default", name="step time, median (default)", value=16.0, unit="ms"), Metric(id="step_time.iqr.default", name="step time, IQR (default)", value=0.4, unit="ms")]
    summary, findings = perf_regression.compare(make_ctx(tmp_path, base), now, {"step_time.median.default": "step_time.iqr.default"}, "cpu", quiet_timings())
    [finding] = findings
    assert finding.category.value == "perf-regression" and finding.severity is Severity.HIGH and finding.blocking
    assert finding.evidence.data["ratio"] == pytest.approx(1.6)
    assert summary.compared[0].allowed == pytest.approx(0.15)  # 3 x 0.5/10


def test_slower_within_the_measured_spread_is_not_a_regression(tmp_path: Path) -> None:
    base = baseline_with([{"id": "step_time.median.default", "name": "step time, median (default)", "value": 10.0}, {"id": "step_time.iqr.default", "name": "step time, IQR (default)", "value": 1.0}])
    now = [Metric(id="step_time.median.default", name="step time, median (default)", value=12.5, unit="ms"), Metric(id="step_time.iqr.default", name="step time, IQR (default)", value=1.0, unit="ms")]
    summary, findings = perf_regression.compare(make_ctx(tmp_path, base), now, {"step_time.median.default": "step_time.iqr.default"}, "cpu", quiet_timings())
    assert findings == []
    assert summary.compared[0].allowed == pytest.approx(0.3)


def test_peak_memory_regression_is_medium_under_fifty_percent(tmp_path: Path) -> None:
    base = baseline_with([{"id": "memory.peak.live_tensors", "name": "peak live tensor memory (instrumented run)", "value": 1_000_000}])
    now = [Metric(id="memory.peak.live_tensors", name="peak live tensor memory (instrumented run)", value=1_200_000, unit="bytes")]
    _, [finding] = perf_regression.compare(make_ctx(tmp_path, base), now, {}, "cpu")
    assert finding.severity is Severity.MEDIUM and not finding.blocking


def test_a_baseline_from_another_device_is_not_compared(tmp_path: Path) -> None:
    base = baseline_with([{"id": "step_time.median.default", "name": "step time, median (default)", "value": 1.0}], device="cuda")
    now = [Metric(id="step_time.median.default", name="step time, median (default)", value=100.0, unit="ms")]
    summary, findings = perf_regression.compare(make_ctx(tmp_path, base), now, {"step_time.median.default": "x"}, "cpu")
    assert findings == [] and "not comparable" in (summary.note or "")


@pytest.mark.parametrize(
    ("rate", "explicit", "expected"),
    [(1.0, True, Severity.HIGH), (0.5, True, Severity.MEDIUM), (3.0, False, Severity.MEDIUM), (1.0, False, Severity.LOW)],
)
def test_sync_severity_grows_with_the_rate(rate: float, explicit: bool, expected: Severity) -> None:
    assert perf_sync.severity_for(rate, explicit) is expected


def test_only_direct_per_step_syncs_become_findings(tmp_path: Path) -> None:
    records = [
        {"kind": ".item()", "explicit": False, "site": ["a.py", 3, "f"], "direct": True, "via": "", "per_step": {str(s): 1 for s in range(10)}, "before_training": 0},
        {"kind": "torch.cuda.synchronize()", "explicit": True, "site": ["a.py", 4, "f"], "direct": True, "via": "", "per_step": {str(s): 1 for s in range(10)}, "before_training": 0},
        {"kind": ".item()", "explicit": False, "site": ["a.py", 5, "f"], "direct": False, "via": "torch.amp.grad_scaler.GradScaler._maybe_opt_step", "per_step": {str(s): 1 for s in range(10)}, "before_training": 0},
        {"kind": ".tolist()", "explicit": False, "site": ["a.py", 9, "f"], "direct": True, "via": "", "per_step": {"10": 1}, "before_training": 0},
    ]
    syncs = SyncRecords.model_validate({"records": records, "in_data_loading": 0, "steps_counted": None, "sync_debug_mode": None})
    summary, findings = perf_sync.analyse(make_ctx(tmp_path), syncs, 10, "cpu", lambda site: f"line {site[1]}")
    assert sorted((f.location.line, f.severity.value, f.blocking) for f in findings) == [(3, "low", False), (4, "high", True)]
    assert summary.library_per_step == pytest.approx(1.0)
    after = next(r for r in summary.rows if r.line == 9)
    assert after.in_steps == 0 and after.outside_steps == 1 and not after.finding


def test_amp_targets_are_not_applicable_on_cpu_and_gate_on_cuda(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    fp32 = clock([10.0] * 20, losses=[1.0] * 20)
    amp = clock([12.0] * 20, losses=[1.001] * 20)
    cpu = perf_amp.compare(fp32, amp, 3, 8, "cpu")
    speed = next(m for m in perf_amp.metrics(cpu, ctx.thresholds(PerformancePolicy), None) if m.name.startswith("AMP speedup"))
    assert speed.value == pytest.approx(10 / 12, rel=1e-3) and speed.passed is None and "not applicable on cpu" in speed.note
    assert perf_amp.target_findings(ctx, cpu, ctx.thresholds(PerformancePolicy), None) == []
    fp32, amp = fp32.model_copy(update={"peak_memory_bytes": 1000}), amp.model_copy(update={"peak_memory_bytes": 900})
    cuda = perf_amp.compare(fp32, amp, 3, 8, "cuda")
    assert {f.category.value for f in perf_amp.target_findings(ctx, cuda, ctx.thresholds(PerformancePolicy), None)} == {"amp-speedup", "amp-memory"}
    assert perf_amp.accuracy_finding(ctx, cpu, ctx.thresholds(PerformancePolicy), None) is None  # 0.1 % drift


def loader(wait_ms: float, steps: int = 20, fed: int = 20, name: str = "t.Slow") -> dict[str, Any]:
    return {
        "site": ["t.py", 9, "f"], "settings": {"num_workers": 0, "batch_size": 4, "pin_memory": False, "prefetch_factor": None, "persistent_workers": False}, "dataset": name, "getitem": ["t.py", 20, "__getitem__"],
        "wait_s": wait_ms * steps / 1e3, "batches": steps, "fed_steps": fed, "step_waits": {str(i): wait_ms / 1e3 for i in range(steps)},
    }


def test_input_stall_needs_a_loader_and_a_majority_wait(tmp_path: Path) -> None:
    waiting = clock([10.0] * 20, data_ms=[9.0] * 20, loaders=[loader(9.0)])
    _, finding = perf_timing.input_stall(make_ctx(tmp_path), waiting, 3, 8, "default")
    assert finding is not None and finding.severity is Severity.HIGH and finding.location.line == 20
    assert finding.evidence.data["loader"]["num_workers"] == 0
    _, none = perf_timing.input_stall(make_ctx(tmp_path), clock([10.0] * 20, data_ms=[4.0] * 20, loaders=[loader(4.0)]), 3, 8, "default")
    assert none is None
    _, no_loader = perf_timing.input_stall(make_ctx(tmp_path), clock([10.0] * 20, data_ms=[9.0] * 20), 3, 8, "default")
    assert no_loader is None


def test_an_evaluation_loader_between_epochs_is_not_the_training_loader(tmp_path: Path) -> None:
    slow_eval = loader(9.0, fed=2, name="t.Eval")
    fast_train = loader(0.5, fed=18, name="t.Train")
    summary, finding = perf_timing.input_stall(make_ctx(tmp_path), clock([10.0] * 20, data_ms=[9.5] * 20, loaders=[slow_eval, fast_train]), 3, 8, "default")
    assert finding is None
    assert summary.loader is not None and summary.loader.dataset == "t.Train" and summary.median_share == pytest.approx(0.05)


def test_the_stage_without_an_entrypoint_is_skipped(tmp_path: Path) -> None:
    outcome = PerformanceStage().run(make_ctx(tmp_path))
    assert outcome.skipped_reason and "entrypoint" in outcome.skipped_reason
    assert outcome.findings == []


def test_analyse_reports_what_was_not_measured(tmp_path: Path) -> None:
    profile = {
        "clock": clock([5.0] * 20),
        "memory": {"source": "live tensor storages (dispatch-mode registry)", "held_bytes": [1000] * 20, "peak_tracked_bytes": 2000, "checks": [], "growth_lines": [], "retained_at_end": []},
        "syncs": {"records": []},
        "amp": {"matmul_dtypes_in_steps": {"float32": 40}, "matmul_dtypes_outside_steps": {}, "reduced_in_steps": 0, "autocast": []},
        "sampler": {"interval_s": 0.002, "samples": []},
    }
    outcome = analyse(make_ctx(tmp_path, entrypoint={"call": "m:f", "amp_flag": "amp"}), full_payload(profile), {"fp32": clock([5.0] * 20), "amp": clock([4.0] * 20)}, [], "amp")
    assert {f.category.value for f in outcome.findings} == {"amp-inactive"}
    assert any("AMP was not active" in line for line in outcome.details["not_measured"])
    assert any("no baseline" in line for line in outcome.details["not_measured"])
    # A payload without a host measure: said as not measured, and no host metric shown as passed.
    assert any(line.startswith("Host memory between steps: this system offers no host measure") for line in outcome.details["not_measured"])
    assert all(m.id != "memory.host_growth" for m in outcome.metrics)


def test_graphs_kept_in_a_container_or_grown_by_one_tensor_are_leaks(tmp_path: Path) -> None:
    holder = {
        "description": "local `losses` (list) in `train()`", "graph": True, "chain": ["list"], "kind": "local", "name": "losses", "owner": "train", "path": "t.py", "line": 5,
        "held_type": "list", "reference": "losses[<int>]", "steps": None, "created_at": {"path": "t.py", "line": 9, "function": "train", "code": "loss = f(x)"},
    }
    site = {"site": {"path": "t.py", "line": 9, "function": "train", "code": "loss = f(x)"}, "storages": 0, "bytes": 0, "steps": 0}
    checks = [
        {"step": 11, "span": 7, "sites": [{**site, "storages": 7, "steps": 7}], "holder": holder, "graphs": []},
        {"step": 19, "span": 15, "sites": [{**site, "storages": 15, "steps": 15}], "holder": holder, "graphs": []},
    ]
    growth = [{"holder": holder["description"], "container": "list", "depth": 0, "site": {"path": "t.py", "line": 12, "function": "train", "code": "losses.append(loss)"}}]
    memory = memory_record({"held_bytes": [1000 + 16 * i for i in range(30)], "checks": checks, "growth_lines": growth, "step_graph_nodes": 10})
    details, [finding] = perf_memory.analyse(make_ctx(tmp_path), memory, 3, 8, "cpu")
    # 16 bytes a step: under the floor by bytes alone, yet one verdict over both measures says leak.
    assert details.verdict.leak and not details.verdict.bytes_leak
    assert finding.category.value == "memory-leak" and finding.severity is Severity.HIGH
    assert (finding.location.path, finding.location.line) == ("t.py", 12)
    graph = {
        "description": "local `total` (tensor with its autograd graph) in `train()`", "created_at": {"path": "t.py", "line": 14, "function": "train", "code": "total = total + loss"},
        "kind": "local", "name": "total", "owner": "train", "path": "t.py", "line": 5, "held_type": "Tensor", "chain": [], "graph": True, "reference": "total", "steps": None,
    }
    running = {"held_bytes": [1000] * 30, "step_graph_nodes": 10, "growth_lines": [],
               "checks": [{"step": s, "span": 1, "sites": [], "holder": None, "graphs": [{**graph, "nodes": n}]} for s, n in ((11, 74), (19, 130), (35, 242))]}
    _, [grown] = perf_memory.analyse(make_ctx(tmp_path), memory_record(running), 3, 8, "cpu")
    assert grown.location.line == 14 and grown.evidence.data["nodes_at_step"] == [[11, 74], [19, 130], [35, 242]]
    bounded = {**running, "checks": [{**c, "graphs": [{**graph, "nodes": 40}]} for c in running["checks"]]}
    assert perf_memory.analyse(make_ctx(tmp_path), memory_record(bounded), 3, 8, "cpu")[1] == []


@pytest.mark.parametrize(
    ("source", "enables"),
    [
        # nanoGPT's shape: a null context on the CPU, autocast on any other device.
        ("ctx = nullcontext() if device_type == 'cpu' else torch.amp.autocast(device_type=device_type, dtype=ptdtype)\n", "only off the CPU"),
        ("ctx = torch.autocast('cuda', dtype=torch.float16) if x.device.type == 'cuda' else nullcontext()\n", "only on CUDA"),
        ("ctx = nullcontext() if not torch.cuda.is_available() else torch.cuda.amp.autocast()\n", "only on CUDA"),
        ("if device.type != 'cpu':\n    ctx = autocast(device.type)\nelse:\n    ctx = nullcontext()\n", "only off the CPU"),
        ("if 'cuda' in device and use_amp:\n    with torch.autocast('cuda'):\n        loss = model(x)\n", "only on CUDA"),
    ],
)
def test_autocast_chosen_by_a_device_check_is_a_cuda_only_gate(tmp_path: Path, source: str, enables: str) -> None:
    (tmp_path / "train.py").write_text("import torch\n" + source)
    gate = perf_amp.cuda_only_gate(tmp_path, {"dtype"}, ["train.py"])
    assert gate is not None and (gate.path, gate.line, gate.enables) == ("train.py", 2, enables)
    assert "autocast" in gate.code or gate.code.startswith("if ")


@pytest.mark.parametrize(
    "source",
    [
        # Autocast on the CPU side of the check: the CPU run should have entered it.
        "ctx = torch.autocast('cpu') if device_type == 'cpu' else nullcontext()\n",
        "if device.type == 'cuda':\n    ctx = nullcontext()\nelse:\n    ctx = torch.autocast('cpu')\n",
        # A test that is no device check, and a device check that chooses no autocast.
        "ctx = torch.autocast('cpu') if use_amp else nullcontext()\n",
        "scale = 2.0 if device_type == 'cpu' else 1.0\n",
    ],
)
def test_autocast_not_kept_off_the_cpu_by_a_device_check_is_no_gate(tmp_path: Path, source: str) -> None:
    (tmp_path / "train.py").write_text("import torch\n" + source)
    assert perf_amp.cuda_only_gate(tmp_path, {"dtype"}, ["train.py"]) is None


def test_a_script_s_inactive_amp_is_named_by_its_amp_arguments(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, entrypoint={"script": "train.py", "amp_args": {"on": ["--dtype=bfloat16"], "off": ["--dtype=float32"]}})
    counts = AmpCounts.model_validate({"matmul_dtypes_in_steps": {"float32": 40}, "matmul_dtypes_outside_steps": {}, "reduced_in_steps": 0, "autocast": []})
    finding, metrics = perf_amp.inactive_check(ctx, counts, [], "amp_args", "cpu")
    assert finding is not None and metrics == []
    assert finding.problem.startswith("With the script's AMP arguments (`--dtype=bfloat16`), all 40 matrix products")
    assert "the script's AMP arguments switch nothing on" in finding.problem and "amp_args=True" not in finding.problem
    keyword = make_ctx(tmp_path, entrypoint={"call": "m:f", "amp_flag": "use_amp"})
    finding, _ = perf_amp.inactive_check(keyword, counts, [], "use_amp", "cpu")
    assert finding is not None and finding.problem.startswith("With `use_amp=True`, all 40") and "the flag switches nothing on" in finding.problem
