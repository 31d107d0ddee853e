"""The correctness stage's distributed check end to end: `traingate run --stages correctness`
on fixture targets that configure `[tool.traingate.distributed] nproc = 2`, run under torchrun
with the gloo backend on the CPU; expected lines come from `# marker:` comments."""

from __future__ import annotations

import hashlib
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TARGETS, line_of
from traingate.stages.correctness.probe.payloads import RanksPayload

pytestmark = pytest.mark.slow

STAGE = ("--stages", "correctness")


def marker_line(case: str, marker: str) -> int:
    return line_of(TARGETS / case / "train.py", f"# marker: {marker}")


def located(finding: dict[str, Any]) -> tuple[str, int]:
    return finding["location"]["path"], finding["location"]["line"]


def distributed_run(details: dict[str, Any]) -> dict[str, Any]:
    [run] = [r for r in details["runs"] if r["label"] == "distributed"]
    return run


def test_ddp_wrapped_model_with_a_distributed_sampler_passes(gate) -> None:
    run = gate("corr_ddp_clean", *STAGE)
    assert run.returncode == 0 and run.report["decision"] == "PASS" and run.findings() == []
    details = run.stage("correctness")["details"]
    check = details["checks"]["distributed"]
    assert check["ran"] is True and (check["nproc"], check["backend"], check["start_method"]) == (2, "gloo", "fork")
    assert check["steps_per_rank"] == [4, 4] and check["ddp_wrapped"] is True
    assert [r["ending"] for r in check["ranks"]] == ["returned", "returned"]
    # Every parameter of the two Linear layers compared, and the loader's sampler seen.
    assert check["tensors_compared"] == 4 and check["loaders"] == [{"sampler": "DistributedSampler", "steps": 4, "batches": 4}]
    assert [r["label"] for r in details["runs"]] == ["instrumented", "distributed"]
    [metric] = [m for m in run.stage("correctness")["metrics"] if m["id"] == "distributed.parameters_differing"]
    assert (metric["value"], metric["threshold"], metric["passed"]) == (0, 0, True)


def test_rank_seeded_weights_without_ddp_diverge_at_the_seed_line(gate) -> None:
    run = gate("corr_ddp_unwrapped", *STAGE)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "ddp-divergence" and finding["severity"] == "high" and finding["blocking"] is True
    assert located(finding) == ("train.py", marker_line("corr_ddp_unwrapped", "seed"))
    assert "not wrapped in DistributedDataParallel" in finding["title"]
    data = finding["evidence"]["data"]
    assert data["reason"] == "parameters" and data["first_parameter"] == "Sequential[0].0.weight"
    assert data["parameters_differing"] == 4 and data["max_abs_difference"] > 0
    assert data["initial_weights_differ"] is True and data["ddp_wrappers"] == []
    assert data["rank_dependent_seed"]["seeds"] == [1234, 1235]
    assert "no DistributedDataParallel was built" in finding["problem"]
    [metric] = [m for m in run.stage("correctness")["metrics"] if m["id"] == "distributed.parameters_differing"]
    assert (metric["value"], metric["passed"]) == (4, False)


def test_a_loader_without_distributed_sampler_feeds_every_rank_the_same_batches(gate) -> None:
    run = gate("corr_ddp_same_data", *STAGE)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    # DDP keeps the parameters identical: the one finding is about the data.
    [finding] = run.findings()
    assert finding["category"] == "ddp-divergence" and finding["blocking"] is True
    assert located(finding) == ("train.py", marker_line("corr_ddp_same_data", "loader"))
    assert "same batches" in finding["title"] and "no DistributedSampler" in finding["title"]
    data = finding["evidence"]["data"]
    assert data["reason"] == "same-data" and data["sampler"] == "RandomSampler"
    assert data["batches_compared"] == 4 and data["batches_per_rank"] == [4, 4]


def test_a_collective_one_rank_skips_is_a_hang_with_every_ranks_stacks(gate) -> None:
    started = time.monotonic()
    run = gate("corr_ddp_skipped_collective", *STAGE)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "hang" and finding["severity"] == "critical" and finding["blocking"] is True
    assert located(finding) == ("train.py", marker_line("corr_ddp_skipped_collective", "waiting"))
    data = finding["evidence"]["data"]
    assert data["waiting_rank"] == 0
    skipped = data["skipped_collective"]
    assert (skipped["function"], skipped["rank"], skipped["most"], skipped["fewest_rank"], skipped["fewest"]) == ("all_reduce", 0, 4, 1, 3)
    assert [r["ending"] for r in data["ranks"]] == ["still running at the timeout", "returned"]
    stacks = finding["evidence"]["traceback"]
    rank0, rank1 = stacks.split("===== rank 1 ")
    waiting = f'train.py", line {marker_line("corr_ddp_skipped_collective", "waiting")} in train'
    assert rank0.startswith("===== rank 0 ") and waiting in rank0
    # Rank 1 returned and waits in the launcher's worker wrapper: its stack is there too.
    assert "(returned)" in rank1 and "in _wrap" in rank1 and waiting not in rank1
    # The ranks' timeout bounds the run: 10 s configured from the launch, then half a second to
    # dump the stacks, the kill and the report (the child's own budget, 5 s more, was not hit:
    # that would be a stage-error).
    timeout = data["timeout_s"]
    details = run.stage("correctness")["details"]
    assert timeout == 10 and timeout <= details["checks"]["distributed"]["duration_s"] < timeout + 2
    assert distributed_run(details)["outcome"] == "ranks still running at the 10s timeout"
    assert time.monotonic() - started < timeout + 30


@pytest.mark.parametrize(
    ("statement", "title", "endings"),
    [
        # Rank 0 then waits in DDP's gradient all_reduce for rank 1, and is stopped a grace
        # period later, long before the 40 s timeout.
        ("raise RuntimeError('rank 1 gives up')", "raised RuntimeError", ["still running 3s after rank 1 failed", "raised"]),
        # Rank 0's all_reduce then fails with gloo's connection reset (a consequence, not the
        # crash), or, on a loaded machine where gloo is slower to notice, the launcher stops it a
        # grace period after it saw rank 1 gone without a record, or torchrun itself stops it
        # first (observed on 2 shared cores with and without the training-facts instrument).
        ("os._exit(3)", "exited with status 3", [
            ("raised", "still running 3s after rank 1 failed", "stopped by the launcher after another rank failed"), "exited with status 3 before reporting",
        ]),
    ],
)
def test_a_rank_that_crashes_is_an_entrypoint_crash_at_its_line(gate, tmp_path: Path, statement: str, title: str, endings: list[str | tuple[str, ...]]) -> None:
    target = tmp_path / "rank_crash"
    shutil.copytree(TARGETS / "corr_ddp_clean", target)
    source = (target / "train.py").read_text()
    crash = f"        if rank == 1 and _step == 2:\n            {statement}  # marker: crash\n"
    (target / "train.py").write_text(source.replace("        optimizer.step()\n", "        optimizer.step()\n" + crash, 1))
    run = gate(target, *STAGE)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "entrypoint-crash" and finding["blocking"] is True
    assert located(finding) == ("train.py", line_of(target / "train.py", "# marker: crash"))
    assert f"rank 1, {title}" in finding["title"]
    check = run.stage("correctness")["details"]["checks"]["distributed"]
    for rank, ending in zip(check["ranks"], endings, strict=True):
        assert rank["ending"] in ending if isinstance(ending, tuple) else rank["ending"] == ending, rank
    assert check["duration_s"] < check["timeout_s"] - 10  # never waited for the 40 s timeout


def test_backend_follows_the_device() -> None:
    from traingate.stages.correctness.torchrun import backend_for

    assert (backend_for("cpu"), backend_for("cuda")) == ("gloo", "nccl")


def _digest(name: str) -> str:
    return hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def _rank_watch(running_mean: str, *, broadcast_buffers: bool | None) -> RanksPayload:
    """What RankWatch reports for a Linear + BatchNorm1d model, identical parameters, the
    BatchNorm's running mean digest given; wrapped in DDP unless `broadcast_buffers` is None."""
    wrapped = broadcast_buffers is not None
    tensor = {"module": "BatchNorm1d", "site": 0, "module_site": 1, "in_ddp": wrapped, "shape": [8], "sampled": False, "numel": 8}
    return RanksPayload.model_validate({
        "steps": 4,
        "sites": [{"path": "train.py", "line": 20, "function": "train", "code": "model = DDP(model)"}, {"path": "train.py", "line": 19, "function": "train", "code": "bn"}],
        "tensors": [
            {**tensor, "name": "m.1.weight", "kind": "parameter", "digest": _digest("w"), "values": [1.0] * 8},
            {**tensor, "name": "m.1.running_mean", "kind": "buffer", "digest": _digest(running_mean), "values": [0.5 if running_mean == "b" else 0.25] * 8},
        ],
        "initial": {"m.1.weight": _digest("w0")},
        "ddp": [{"site": 0, "module": "Sequential", "broadcast_buffers": broadcast_buffers}] if wrapped else [],
        "seeds": [],
        "loaders": [],
    })


@pytest.mark.parametrize(("broadcast_buffers", "reported"), [(False, True), (None, True), (True, False)])
def test_batchnorm_statistics_that_nothing_synchronises_are_reported(tmp_path: Path, broadcast_buffers: bool | None, reported: bool) -> None:
    from traingate.pipeline.model.config import TargetConfig
    from traingate.pipeline.model.schema import Location
    from traingate.stages.base import StageContext
    from traingate.stages.correctness.divergence import divergence_findings

    ctx = StageContext(stage="correctness", root=tmp_path, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=tmp_path)
    watches = [_rank_watch("a", broadcast_buffers=broadcast_buffers), _rank_watch("b", broadcast_buffers=broadcast_buffers)]
    findings = divergence_findings(ctx, watches, Location(path="train.py"))
    if not reported:
        # DDP overwrites the buffers with rank 0's at every forward: a difference after the last
        # forward is expected.
        assert findings == []
        return
    [finding] = findings
    assert finding.category.value == "ddp-divergence" and "unsynchronised BatchNorm" in finding.title
    assert (finding.location.path, finding.location.line) == ("train.py", 19)  # where the BatchNorm was built
    assert finding.evidence.data["buffers"] == [{"name": "m.1.running_mean", "max_abs_difference": 0.25}]
    # Identical buffers are no finding whatever the wrapping.
    assert divergence_findings(ctx, [watches[0], watches[0]], Location(path="train.py")) == []


def test_unsynchronised_batchnorm_statistics_end_to_end(gate) -> None:
    # DDP keeps the weights identical (no parameter differs), but with broadcast_buffers=False
    # each rank's running statistics follow its own batches.
    run = gate("corr_ddp_batchnorm", *STAGE)
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [finding] = run.findings()
    assert finding["category"] == "ddp-divergence" and finding["blocking"] is True
    assert located(finding) == ("train.py", marker_line("corr_ddp_batchnorm", "batchnorm"))
    data = finding["evidence"]["data"]
    assert data["reason"] == "batchnorm-buffers"
    assert {b["name"].rsplit(".", 1)[1] for b in data["buffers"]} == {"running_mean", "running_var"}
    assert all(b["max_abs_difference"] > 0 for b in data["buffers"])
    assert [w["broadcast_buffers"] for w in data["ddp_wrappers"]] == [False]
    [metric] = [m for m in run.stage("correctness")["metrics"] if m["id"] == "distributed.parameters_differing"]
    assert (metric["value"], metric["passed"]) == (0, True)
