"""`traingate merge`: parts of a split run (CPU job, GPU job) become one report and one decision."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import GateRun, cli_in_process
from tests.report_builders import measured, report, stage, write
from traingate.pipeline.gate.merge import MergeError, merge_reports
from traingate.pipeline.gate.policy import decide
from traingate.pipeline.model.schema import Acceptance, BaselineComparison, PipelineReport, Severity, WaiverEntry
from traingate.stages.performance.rules import HOST_SYNC

KNOWN = ["execution", "performance", "concurrency", "correctness"]


def merge(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_in_process("merge", *args)


def _split_run(tmp_path: Path) -> tuple[Path, Path]:
    cpu = report([stage("execution")], device="cpu")
    sync = measured("performance", HOST_SYNC, Severity.HIGH, "loop.py", "loss.item()")
    gpu = report([stage("performance", [sync]), stage("concurrency"), stage("correctness")], device="cuda")
    return write(cpu, tmp_path / "cpu" / "report.json"), write(gpu, tmp_path / "gpu" / "report.json")


def test_a_split_run_merges_into_one_decision(tmp_path: Path) -> None:
    cpu, gpu = _split_run(tmp_path)
    # A part's own decision is never copied: forge the GPU part's verdict and score.
    forged = json.loads(gpu.read_text())
    forged.update(decision="PASS", score=100)
    gpu.write_text(json.dumps(forged))

    done = merge(str(cpu), str(gpu), "--out", str(tmp_path / "merged"))
    assert done.returncode == 1, done.stderr
    merged = PipelineReport.model_validate_json((tmp_path / "merged" / "report.json").read_text())
    assert [s.name for s in merged.stages] == KNOWN
    assert (merged.decision, merged.score) == decide(merged.stages)
    assert merged.decision.value == "BLOCK" and merged.score <= 69
    devices = {s.name: s.environment.device for s in merged.stages if s.environment}
    assert devices == {"execution": "cpu", "performance": "cuda", "concurrency": "cuda", "correctness": "cuda"}
    assert merged.environment.device == "cpu + cuda"
    for name in ("report.md", "execution.md", "performance.md", "concurrency.md"):
        assert (tmp_path / "merged" / name).is_file()
    assert "host-sync" in (tmp_path / "merged" / "report.md").read_text()


def test_a_requested_stage_that_no_part_holds_blocks(tmp_path: Path) -> None:
    cpu, _ = _split_run(tmp_path)
    done = merge(str(cpu), "--out", str(tmp_path / "merged"))
    assert done.returncode == 1
    merged = json.loads((tmp_path / "merged" / "report.json").read_text())
    errors = {f["stage"]: f for s in merged["stages"] for f in s["findings"] if f["category"] == "stage-error"}
    assert set(errors) == {"performance", "concurrency", "correctness"} and all(f["blocking"] for f in errors.values())
    assert {s["name"]: s["status"] for s in merged["stages"]} == {"execution": "passed", "performance": "error", "concurrency": "error", "correctness": "error"}

    only_execution = merge(str(cpu), "--stages", "execution", "--out", str(tmp_path / "merged-exec"))
    assert only_execution.returncode == 0, only_execution.stderr
    merged = json.loads((tmp_path / "merged-exec" / "report.json").read_text())
    assert merged["decision"] == "PASS" and [n["name"] for n in merged["stages_not_run"]] == ["performance", "concurrency", "correctness"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"task": "T2"}, "task 'T2'"),
        ({"version": "v2"}, "version 'v2'"),
        ({"commit": "def456"}, "commit 'def456'"),
        ({"stage": "execution"}, "stage 'execution' is in both"),
        ({"schema_version": "9.0"}, "unknown schema version '9.0'"),
        ({"block_on": ["critical"]}, "different policies"),
    ],
)
def test_parts_that_do_not_belong_together_are_refused(tmp_path: Path, change: dict, message: str) -> None:
    cpu, _ = _split_run(tmp_path)
    other_stage = change.pop("stage", "performance")
    schema_version = change.pop("schema_version", None)
    other = report([stage(other_stage)], device="cuda", **change)
    data = json.loads(other.model_dump_json())
    if schema_version:
        data["schema_version"] = schema_version
    (tmp_path / "other.json").write_text(json.dumps(data))

    done = merge(str(cpu), str(tmp_path / "other.json"), "--out", str(tmp_path / "merged"))
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "merged" / "report.json").exists()


def test_a_real_cpu_part_merges_with_a_gpu_part(tmp_path: Path, shared_gate: Callable[..., tuple[GateRun, float]]) -> None:
    cpu, _ = shared_gate("exec_clean", "--stages", "execution")  # the run tests/stages/execution/test_execution.py reads
    assert cpu.returncode == 0, cpu.stderr
    real = PipelineReport.model_validate(cpu.report)
    gpu = report([stage("performance"), stage("concurrency"), stage("correctness")], device="cuda", task=real.task, version=real.version, commit=real.target.commit)
    gpu = gpu.model_copy(update={"policy": real.policy})
    done = merge(str(cpu.out / "report.json"), str(write(gpu, tmp_path / "gpu.json")), "--out", str(tmp_path / "merged"))
    assert done.returncode == 0, done.stderr
    merged = json.loads((tmp_path / "merged" / "report.json").read_text())
    assert merged["decision"] == "PASS" and [s["name"] for s in merged["stages"]] == KNOWN
    assert merged["stages"][0]["findings"] == cpu.report["stages"][0]["findings"]


def _entry(origin: str, status: str, matched: list[str]) -> WaiverEntry:
    return WaiverEntry(origin=origin, source="config", categories=["host-sync"], path="loop.py", reason="r", status=status, matched=matched)


def test_waivers_and_baselines_combine_across_parts() -> None:
    cpu = report([stage("execution")]).model_copy(update={
        "acceptance": Acceptance(waivers=[_entry("#1", "unused", []), _entry("#2", "unused", [])]),
        # The CPU part has none of the baseline's findings: it lists every one as fixed.
        "baseline": BaselineComparison(path="b.json", version="v0", fixed_findings=["exec-gone", "perf-kept", "perf-gone"]),
    })
    gpu = report([stage("performance")], device="cuda").model_copy(update={
        "acceptance": Acceptance(waivers=[_entry("#1", "applied", ["f1"]), _entry("#2", "unused", [])]),
        "baseline": BaselineComparison(path="b.json", version="v0", fixed_findings=["exec-gone", "perf-gone"], persisting_findings=["perf-kept"]),
    })
    merged = merge_reports([("cpu", cpu), ("gpu", gpu)], ["execution", "performance"], KNOWN)
    assert merged.acceptance is not None
    assert [(w.origin, w.status, w.matched) for w in merged.acceptance.waivers] == [("#1", "applied", ["f1"]), ("#2", "unused", [])]
    assert merged.baseline is not None
    assert merged.baseline.fixed_findings == ["exec-gone", "perf-gone"] and merged.baseline.persisting_findings == ["perf-kept"]

    other_baseline = gpu.model_copy(update={"baseline": BaselineComparison(path="b.json", version="v9")})
    with pytest.raises(MergeError, match="different baselines"):
        merge_reports([("cpu", cpu), ("gpu", other_baseline)], ["execution"], KNOWN)


def test_the_block_on_a_part_recorded_is_read_back_through_the_policy_model() -> None:
    from traingate.pipeline.gate.merge import _block_on

    assert _block_on(report([stage("execution")], block_on=["critical"])) == {Severity.CRITICAL}
    assert _block_on(report([stage("execution")]).model_copy(update={"policy": None})) == {Severity.CRITICAL, Severity.HIGH}
    with pytest.raises(ValueError, match="block_on"):
        _block_on(report([stage("execution")], block_on=["severe"]))
