"""The performance stage end to end on fixture targets: one gate run per target, every
assertion about that run in one test (so parallel workers never run a target twice)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, TARGETS, GateRun, line_of, run_gate
from tests.stages.performance.performance_runs import PERFORMANCE, Shared, metric, only

pytestmark = pytest.mark.slow


def marker_line(path: Path, marker: str) -> int:
    return line_of(path, f"marker: {marker}")


def test_losses_kept_with_their_graph_leak_at_the_append(shared_gate: Shared) -> None:
    run = shared_gate("perf_leak_graph", *PERFORMANCE)[0]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    leak = only(run, "memory-leak")
    assert leak["location"]["path"] == "train.py"
    assert leak["location"]["line"] == marker_line(TARGETS / "perf_leak_graph" / "train.py", "leak-append")
    assert leak["severity"] == "high" and leak["blocking"]
    data = leak["evidence"]["data"]
    assert leak["evidence"]["kind"] == "measured" and data["leak"] and data["slope_bytes_per_step"] >= 64 and data["r2"] > 0.9
    assert data["held_by"]["kind"] == "local" and data["held_by"]["name"] == "losses" and data["held_by"]["graph"]
    # The `.item()` calls after the loop are not per-step syncs.
    assert run.findings("host-sync") == []
    assert run.categories() == {"memory-leak"}


def test_an_unbounded_cache_on_a_trainer_leaks_where_it_is_filled(shared_gate: Shared) -> None:
    run = shared_gate("perf_leak_cache", *PERFORMANCE)[0]
    assert run.returncode == 1
    leak = only(run, "memory-leak")
    assert leak["location"] == {
        "path": "trainer.py",
        "line": marker_line(TARGETS / "perf_leak_cache" / "trainer.py", "leak-cache"),
        "function": "training_step",
    }
    assert leak["severity"] == "high" and leak["blocking"]
    held = leak["evidence"]["data"]["held_by"]
    assert held["description"] == "`self.feature_cache` (dict) of `Trainer`"
    assert leak["evidence"]["data"]["slope_bytes_per_step"] == pytest.approx(128 * 64 * 4, rel=0.1)
    md = (run.out / "performance.md").read_text()
    assert "xychart-beta" in md and "Held by `self.feature_cache` (dict) of `Trainer`" in md


def test_per_step_reads_are_host_syncs_at_each_line(shared_gate: Shared) -> None:
    run = shared_gate("perf_sync", *PERFORMANCE)[0]
    source = TARGETS / "perf_sync" / "loop.py"
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    found = {f["location"]["line"]: f for f in run.findings("host-sync")}
    expected = {marker_line(source, m): s for m, s in (("sync-item", "low"), ("sync-tolist", "low"), ("sync-cpu", "low"), ("sync-bool", "medium"))}
    assert {line: f["severity"] for line, f in found.items()} == expected
    assert marker_line(source, "sync-after") not in found
    for f in found.values():
        assert f["location"]["path"] == "loop.py" and not f["blocking"]
        assert f["evidence"]["kind"] == "measured" and f["evidence"]["data"]["device"] == "cpu"
    assert found[marker_line(source, "sync-item")]["evidence"]["data"]["per_step"] == pytest.approx(1.0)
    assert found[marker_line(source, "sync-bool")]["evidence"]["data"]["per_step"] == pytest.approx(3.0)
    assert run.categories() == {"host-sync"}


def test_autocast_around_nothing_is_amp_inactive(shared_gate: Shared) -> None:
    run = shared_gate("perf_amp_inactive", *PERFORMANCE)[0]
    assert run.returncode == 1
    inactive = only(run, "amp-inactive")
    assert inactive["location"]["line"] == marker_line(TARGETS / "perf_amp_inactive" / "train.py", "amp-empty")
    assert inactive["severity"] == "high" and inactive["blocking"]
    # 30 steps x (2 addmm forward + 3 mm backward: the first layer's input needs no gradient).
    assert inactive["evidence"]["data"]["matmul_dtypes_in_steps"] == {"float32": 150}
    # Both timing runs computed in fp32: no speedup is reported, only that AMP was not active.
    speed = metric(run, "AMP speedup")
    assert speed["passed"] is None and speed["threshold"] == 1.5 and "AMP was not active" in speed["note"]
    assert speed["value"] is None
    md = (run.out / "performance.md").read_text()
    assert "**AMP was not active:**" in md and not re.search(r"Speedup [\d.]+x", md)
    assert not run.categories() & {"amp-speedup", "amp-memory"}


def test_a_loss_that_loses_precision_in_bf16_is_amp_accuracy(shared_gate: Shared) -> None:
    run = shared_gate("perf_amp_accuracy", *PERFORMANCE)[0]
    assert run.returncode == 1
    accuracy = only(run, "amp-accuracy")
    assert accuracy["location"]["line"] == marker_line(TARGETS / "perf_amp_accuracy" / "train.py", "amp-autocast")
    assert accuracy["severity"] == "high" and accuracy["blocking"]
    assert accuracy["evidence"]["data"]["relative_drift"] > 0.01
    drift = metric(run, "AMP final loss drift")
    assert drift["passed"] is False and drift["value"] > drift["threshold"]
    assert "amp-inactive" not in run.categories()


def test_a_sleeping_dataset_is_an_input_stall(shared_gate: Shared) -> None:
    run = shared_gate("perf_stall", *PERFORMANCE)[0]
    assert run.returncode == 1
    stall = only(run, "input-stall")
    assert stall["location"] == {"path": "train.py", "line": marker_line(TARGETS / "perf_stall" / "train.py", "slow-getitem"), "function": "__getitem__"}
    assert stall["severity"] == "high" and stall["blocking"]
    data = stall["evidence"]["data"]
    assert data["median_wait_share"] > 0.8 and data["loader"]["num_workers"] == 0 and data["loader"]["batch_size"] == 4
    assert data["loader"]["created_at"][0] == "train.py"


def test_correct_amp_loop_passes_with_measured_numbers(shared_gate: Shared) -> None:
    run = shared_gate("perf_clean_amp", *PERFORMANCE)[0]
    assert run.returncode == 0 and run.report["decision"] == "PASS", [f["title"] for f in run.findings()]
    assert run.findings() == []
    stage = run.stage("performance")
    assert stage["status"] == "passed"
    reduced = metric(run, "AMP reduced-precision")
    assert reduced["value"] > 0
    memory = metric(run, "AMP peak memory reduction")
    assert memory["value"] is None and memory["passed"] is None and "not measured on cpu" in memory["note"]
    syncs = stage["details"]["syncs"]
    # GradScaler.step's inf check syncs every step, inside torch: counted, not reported.
    assert syncs["library_per_step"] == pytest.approx(1.0)
    assert any(r["made_by"] == "library" and "GradScaler" in " ".join(r["kinds"]) for r in syncs["rows"])
    md = (run.out / "performance.md").read_text()
    assert "| | fp32 | AMP |" in md and "not applicable on cpu" in md and "## Not measured, and why" in md


def test_plain_closure_loop_passes_and_every_step_is_found(shared_gate: Shared) -> None:
    run = shared_gate("perf_clean_plain", *PERFORMANCE)[0]
    assert run.returncode == 0 and run.findings() == []
    stage = run.stage("performance")
    assert metric(run, "training steps observed")["value"] == 40
    phases = {p["phase"]: p for p in stage["details"]["breakdown"]["phases"]}
    # forward and backward run inside optimizer.step(closure): charged to themselves.
    assert phases["forward"]["mean_ms"] > 0 and phases["backward"]["mean_ms"] > 0
    assert not stage["details"]["memory"]["verdict"]["leak"]


def test_bounded_cache_is_no_leak_and_a_larger_baseline_peak_is_a_regression(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    # A complete report.json (the gate validates --baseline against the report schema up front).
    baseline.write_text(json.dumps({
        "tool_version": "0.1.0", "task": "T", "version": "v0",
        "target": {"path": "perf_bounded_cache", "commit": None},
        "environment": {"python": "3.11", "torch": "2.13.0", "device": "cpu", "device_name": "cpu"},
        "started_at": "2026-01-01T00:00:00+00:00", "duration_s": 1.0, "decision": "PASS", "score": 100,
        "stages": [{"name": "performance", "status": "passed", "score": 100, "duration_s": 1.0, "summary": "", "metrics": [
            # Labels reworded since this baseline: metrics are matched on their ids.
            {"id": "step_time.median.default", "name": "step time (median)", "value": 0.001, "unit": "ms"},
            {"id": "step_time.iqr.default", "name": "step time (IQR)", "value": 0.0, "unit": "ms"},
            {"id": "memory.peak.live_tensors", "name": "peak memory", "value": 1000, "unit": "bytes"},
        ]}],
    }))
    run = run_gate(TARGETS / "perf_bounded_cache", tmp_path / "out", *PERFORMANCE, "--baseline", str(baseline))
    assert run.returncode == 1
    assert "memory-leak" not in run.categories()
    verdict = run.stage("performance")["details"]["memory"]["verdict"]
    assert not verdict["leak"] and verdict["steps"] == 37
    regressions = {f["evidence"]["data"]["metric_id"]: f for f in run.findings("perf-regression")}
    # Peak memory, which load does not move, is compared with the stored number; the stored step
    # time records no machine (an older gate), so it is not comparable: listed, never a finding.
    assert set(regressions) == {"memory.peak.live_tensors"}
    assert {f["evidence"]["data"]["metric"] for f in regressions.values()} == {"peak live tensor memory (instrumented run)"}
    assert all(f["severity"] == "high" and f["blocking"] and f["location"] is None for f in regressions.values())
    # The baseline records no commit: its configuration could not be compared (medium, never blocking).
    assert run.categories() == {"perf-regression", "verification-narrowed"}
    assert [(f["rule"], f["blocking"]) for f in run.findings("verification-narrowed")] == [("verification-narrowed/not-compared", False)]
    regression = run.stage("performance")["details"]["regression"]
    assert [r["metric_id"] for r in regression["not_comparable"]] == ["step_time.median.default"]
    assert "older gate" in regression["not_comparable"][0]["reason"] and "records no commit" in regression["side_by_side_note"]


def test_an_entrypoint_without_optimizer_steps_fails_closed(shared_gate: Shared) -> None:
    run = shared_gate("perf_no_steps", *PERFORMANCE)[0]
    assert run.returncode == 1
    error = only(run, "stage-error")
    assert error["blocking"] and "nothing was profiled" in error["title"]
    assert run.stage("performance")["status"] == "error"


def test_no_entrypoint_skips_the_stage_with_a_reason(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "pyproject.toml").write_text('[tool.traingate]\ntask = "no-entrypoint"\n')
    run = run_gate(target, tmp_path / "out", *PERFORMANCE)
    stage = run.stage("performance")
    assert stage["status"] == "skipped" and "entrypoint" in stage["skipped_reason"]
    assert run.findings() == []


def test_example_v6_batching_holds_nothing_and_its_item_syncs_are_counted(tmp_path: Path) -> None:
    materialize = REPO / "examples" / "materialize.py"
    if not materialize.is_file():
        pytest.skip("the example target is not in this checkout")
    target = tmp_path / "v6"
    subprocess.run([sys.executable, str(materialize), "v6", str(target)], check=True, capture_output=True)
    run = run_gate(target, tmp_path / "out", *PERFORMANCE)
    assert "memory-leak" not in run.categories()
    memory = run.stage("performance")["details"]["memory"]
    assert not memory["verdict"]["leak"] and memory["verdict"]["steps"] >= 8
    assert memory["chart"]["kib"] and "xychart-beta" in (run.out / "performance.md").read_text()
    source = target / "utils" / "tier3_training_utilities.py"
    lines = source.read_text().splitlines()
    stacking = [i for i, line in enumerate(lines, start=1) if "torch.stack([train_data[idx] for idx in batch_indices])" in line]
    item_lines = {i for i, line in enumerate(lines, start=1) if ".item())" in line and "history.append" in line}
    assert stacking and len(item_lines) == 2
    syncs = {f["location"]["line"] for f in run.findings("host-sync") if f["location"]["path"] == "utils/tier3_training_utilities.py"}
    assert item_lines <= syncs
    assert not syncs & set(stacking)


ONE_HOT_LOOP = '''import torch
import torch.nn.functional as F
from torch import nn


def run(steps: int = 20) -> None:
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = nn.Linear(3, 3).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    labels = torch.randint(0, 3, (steps, 8))
    labels[:, 0] = 2  # every batch holds the largest class: both one_hots have 3 columns
    for step in range(steps):
        y = labels[step].to(device)
        counted = F.one_hot(y, 3).float()  # marker: one-hot-with-classes
        sized = F.one_hot(y).float()  # marker: one-hot-sized-by-data
        loss = ((model(counted) - sized) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def sync_rows(tmp_path: Path, loop: str) -> tuple[Path, GateRun, dict[int, dict[str, Any]]]:
    """The performance stage's run of `loop` (its `run()` the entrypoint): the target, the run
    and its sync rows in loop.py by line."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "loop.py").write_text(loop)
    (target / "traingate.toml").write_text('task = "syncs"\ntests = false\ntimeout_s = 120\n\n[entrypoint]\ncall = "loop:run"\n')
    run = run_gate(target, tmp_path / "out", *PERFORMANCE)
    assert run.returncode == 0, run.stdout + run.stderr
    return target, run, {row["line"]: row for row in run.stage("performance")["details"]["syncs"]["rows"] if row["path"] == "loop.py"}


def test_one_hot_syncs_only_where_cuda_would(tmp_path: Path) -> None:
    # On a CPU tensor one_hot reads min and max back as range checks; on CUDA it reads
    # nothing when given the class count, and the max once (to size the result) without it.
    target, run, rows = sync_rows(tmp_path, ONE_HOT_LOOP)
    assert marker_line(target / "loop.py", "one-hot-with-classes") not in rows
    sized = rows[marker_line(target / "loop.py", "one-hot-sized-by-data")]
    assert sized["kinds"] == ["scalar read (one_hot without num_classes reads the largest class)"]
    assert sized["per_step"] == pytest.approx(1.0)
    [finding] = run.findings("host-sync")
    assert finding["location"]["line"] == sized["line"] and finding["severity"] == "low"


LENGTHS_LOOP = '''
import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence


def run():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    rnn, head = nn.LSTM(4, 8, batch_first=True).to(device), nn.Linear(8, 1).to(device)
    optimizer = torch.optim.SGD([*rnn.parameters(), *head.parameters()], lr=0.1)
    for _ in range(16):
        lengths = torch.randint(2, 9, (8,))  # made by the collate on the host; never moved
        x, y = torch.randn(8, 8, 4).to(device), torch.randn(8, 1).to(device)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)  # marker: host-lengths-passed
        longest = max(lengths.tolist())  # marker: host-lengths-read
        moved = lengths.to(device)
        steps = int(moved.max())  # marker: device-lengths
        _, (h, _) = rnn(packed)  # marker: packed-batch-sizes
        loss = ((head(h[-1]) - y) ** 2).mean() * (longest + steps) / (longest + steps)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
'''


def test_lengths_that_stay_on_the_host_are_not_syncs_and_moved_ones_are(tmp_path: Path) -> None:
    # pack_padded_sequence takes its lengths on the host: on CUDA the loop keeps them there
    # (the collate made them), so reading them synchronises nothing; read back once moved, they do.
    target, _, rows = sync_rows(tmp_path, LENGTHS_LOOP)
    # ... nor the recurrent layer's reads of the packed sequence's batch sizes, which CUDA keeps on the host.
    for marker in ("host-lengths-passed", "host-lengths-read", "packed-batch-sizes"):
        assert marker_line(target / "loop.py", marker) not in rows
    assert rows[marker_line(target / "loop.py", "device-lengths")]["per_step"] == pytest.approx(1.0)
