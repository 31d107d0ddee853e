"""The CUDA paths, on a machine with a GPU: CUDA-event step times, the allocator's peak and
held memory, the sync debug mode's cross-check, the non_blocking watch, the CUDA sanitizer
(CSAN) and a real float16 speedup. Each fixture under tests/targets/cuda_* trains on the GPU
and carries its defect at a `# marker:` line; `cuda_amp_clean` is the clean control.

Skipped where torch sees no GPU, as on CI: the CPU side of every check is tested elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import TARGETS, GateRun, line_of

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")]

Shared = Callable[..., tuple[GateRun, float]]
ON_CUDA = ("--device", "cuda")


def marker(target: str, name: str) -> int:
    return line_of(TARGETS / target / "train.py", f"marker: {name}")


def details(run: GateRun, stage: str) -> dict[str, Any]:
    return run.stage(stage)["details"]


def test_a_clean_float16_loop_passes_every_stage_with_device_measurements(shared_gate: Shared) -> None:
    run = shared_gate("cuda_amp_clean", *ON_CUDA, "--stages", "performance,concurrency,correctness")[0]
    assert run.report["decision"] == "PASS" and run.returncode == 0, [(f["category"], f["title"]) for f in run.findings()]
    perf = details(run, "performance")
    assert perf["device_kind"] == "cuda" and perf["device"].startswith("cuda")
    assert perf["machine"]["device"] == "cuda" and perf["machine"]["device_name"]
    # Step times from CUDA events, the speedup gated (it is on CUDA) and met by float16 matmuls.
    assert {record["clock"] for record in perf["timing"].values()} == {"cuda events"}
    speed = next(m for m in run.stage("performance")["metrics"] if m["name"].startswith("AMP speedup"))
    assert speed["passed"] is True and speed["value"] >= 1.5, speed
    assert perf["amp"]["active"] is True and perf["amp"]["memory_reduction"] is not None
    # The counter saw no sync of the target's own inside the steps (the non_blocking copy of the
    # loss is none; GradScaler.step's inf check is the library's), and CUDA's sync debug mode
    # warned at the same lines the counter counted: scaler.step() and the synchronize after the loop.
    rows = perf["syncs"]["rows"]
    assert all(row["per_step"] == 0 for row in rows if row["made_by"] == "target"), rows
    assert {row["line"] for row in rows} == {record["site"][1] for record in perf["syncs"]["cuda_sync_debug"]}, rows
    conc = details(run, "concurrency")["checks"]
    assert conc["nonblocking"]["mode"] == "observed", conc["nonblocking"]
    assert conc["streams"]["ran"] is True, conc["streams"]


def test_a_non_blocking_copy_read_at_once_is_an_observed_race(shared_gate: Shared) -> None:
    run = shared_gate("cuda_nonblocking_race", *ON_CUDA, "--stages", "concurrency")[0]
    assert run.report["decision"] == "BLOCK" and run.returncode == 1
    (race,) = run.findings("nonblocking-race")
    assert race["location"]["path"] == "train.py" and race["location"]["line"] == marker("cuda_nonblocking_race", "copy")
    assert race["severity"] == "high" and race["blocking"] and race["evidence"]["kind"] == "observed"
    assert race["evidence"]["data"]["read_site"]["line"] == marker("cuda_nonblocking_race", "read")
    assert {f["category"] for f in run.findings() if f["blocking"]} == {"nonblocking-race"}
    # The racy read can return another value in a rerun: training itself matched, so at most info.
    assert all(f["severity"] == "info" for f in run.findings("nondeterminism"))


def test_a_side_stream_that_never_waits_is_a_stream_race(shared_gate: Shared) -> None:
    run = shared_gate("cuda_stream_race", *ON_CUDA, "--stages", "concurrency")[0]
    assert run.report["decision"] == "BLOCK" and run.returncode == 1
    races = run.findings("stream-race")
    assert races and all(r["evidence"]["kind"] == "observed" and r["blocking"] for r in races)
    assert marker("cuda_stream_race", "side-stream") in {r["location"]["line"] for r in races}, [r["location"] for r in races]
    # The race can make a rerun's losses differ: then the divergence is named at the race.
    for divergence in run.findings("nondeterminism"):
        assert divergence["evidence"]["data"]["kind"] == "race", divergence["problem"]
        assert divergence["location"]["line"] == marker("cuda_stream_race", "side-stream")
    assert run.categories() <= {"stream-race", "nondeterminism"}


def test_per_step_item_and_a_kept_graph_on_cuda(shared_gate: Shared) -> None:
    run = shared_gate("cuda_sync_leak", *ON_CUDA, "--stages", "performance")[0]
    assert run.report["decision"] == "BLOCK" and run.returncode == 1
    (leak,) = run.findings("memory-leak")
    assert leak["location"]["line"] == marker("cuda_sync_leak", "leak-graph") and leak["blocking"]
    assert leak["evidence"]["kind"] == "measured" and leak["evidence"]["data"]["slope_bytes_per_step"] > 0
    (sync,) = run.findings("host-sync")
    assert sync["location"]["line"] == marker("cuda_sync_leak", "sync-item")
    assert sync["evidence"]["data"]["device"].startswith("cuda") and sync["evidence"]["data"]["per_step"] == pytest.approx(1.0)
    # CUDA's own sync debug mode warned at the same line, once a step.
    debug = details(run, "performance")["syncs"]["cuda_sync_debug"]
    at_item = [r for r in debug if r["site"] and r["site"][1] == marker("cuda_sync_leak", "sync-item")]
    assert at_item and all(n == 1 for n in at_item[0]["per_step"].values()), debug
    assert details(run, "performance")["memory"]["source"], details(run, "performance")["memory"]
