"""The baseline's code timed beside this version's, through the gate (docs/baseline-comparison.md).

`tests/targets/perf_side_base` is committed in a git repository and run once for its report; that
report is the `--baseline` of the same code run again (a clean control: whatever load the machine
carries, it must not block on timing), of a version that takes an SVD of its first weight in every
step (several times the step: it blocks), and of the same code against a copy of the report
without its commit and from another machine (the stored step time is not comparable: said at the
top of the performance page, and neither blocking nor passed).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TARGETS, GateRun, run_gate

BASE = TARGETS / "perf_side_base"
SVD = ("        optimizer.step()\n", "        optimizer.step()\n        torch.linalg.svd(model[0].weight.detach())  # marker: svd\n")


def _repository(root: Path) -> Path:
    target = root / "base"
    shutil.copytree(BASE, target, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-qm", "base"]):
        subprocess.run(["git", "-C", str(target), *args], check=True, capture_output=True)
    return target


def _perf(target: Path, out: Path, *args: str) -> GateRun:
    return run_gate(target, out, "--stages", "performance", *args, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, GateRun]:
    root = tmp_path_factory.mktemp("side")
    base = _repository(root)
    first = _perf(base, root / "out-base")
    assert first.returncode == 0, first.stdout + first.stderr
    baseline = root / "out-base" / "report.json"
    slower = root / "svd"
    shutil.copytree(base, slower)
    text = (slower / "train.py").read_text()
    assert SVD[0] in text
    (slower / "train.py").write_text(text.replace(SVD[0], SVD[1]))
    stored: dict[str, Any] = json.loads(baseline.read_text())
    stored["target"]["commit"] = None
    next(s for s in stored["stages"] if s["name"] == "performance")["details"]["machine"]["cpu_model"] = "Another CPU @ 3.0GHz"
    (root / "stored.json").write_text(json.dumps(stored))
    return {
        "base": first,
        "same": _perf(base, root / "out-same", "--baseline", str(baseline)),
        "svd": _perf(slower, root / "out-svd", "--baseline", str(baseline)),
        "stored": _perf(base, root / "out-stored", "--baseline", str(root / "stored.json")),
    }


def _details(run: GateRun) -> dict[str, Any]:
    return run.stage("performance")["details"]


def test_the_base_records_its_machine_and_each_timing_runs_load(runs: dict[str, GateRun]) -> None:
    details = _details(runs["base"])
    machine = details["machine"]
    assert machine["device"] == "cpu" and machine["cpus"] >= 1 and machine["torch"].startswith("2.")
    assert machine["omp_wait_policy"] == os.environ.get("OMP_WAIT_POLICY", "PASSIVE")
    timing = [r for r in details["runs"] if r["label"].startswith("timing")]
    assert timing and all(0.0 <= r["load"]["other_cpu_share"] <= 1.0 and r["load"]["wall_s"] > 0 for r in timing)
    assert "side_by_side" not in details["regression"]


def test_the_same_code_never_blocks_on_timing_whatever_the_load(runs: dict[str, GateRun]) -> None:
    same = runs["same"]
    assert same.returncode == 0, same.stdout + same.stderr
    assert same.findings("perf-regression") == []
    side = _details(same)["regression"]["side_by_side"]
    assert side["order"] == ["A1", "B1", "A2", "B2"] and side["commit"] == runs["base"].report["target"]["commit"]
    assert side["verdict"] in ("not slower", "not measured")
    labels = [r["label"] for r in _details(same)["runs"]]
    # In the order they ran: the timed runs first, while no other stage ran beside them.
    assert labels == ["baseline timing (default)", "timing (default)", "baseline timing (default)", "timing (default)", "profile (instrumented)"]


def test_a_real_slowdown_blocks_from_the_runs_beside_each_other(runs: dict[str, GateRun]) -> None:
    svd = runs["svd"]
    assert svd.returncode == 1
    [finding] = [f for f in svd.findings("perf-regression") if f["evidence"]["data"]["metric_id"] == "step_time.median.default"]
    assert finding["severity"] == "high" and finding["blocking"] and finding["evidence"]["kind"] == "measured"
    side = finding["evidence"]["data"]["side_by_side"]
    assert side["verdict"] == "slower" and finding["evidence"]["data"]["ratio"] >= 2.0
    assert "timed alternately in this run on this machine" in finding["problem"]
    page = (svd.out / "performance.md").read_text()
    assert "## Beside the baseline's code" in page and "**slower**" in page
    # On CPU the step clock is the wall clock, and the page says the CUDA events were not measured.
    assert {m["measure"] for m in side["measures"]} == {"wall clock", "process CPU time"}
    assert "so CUDA events were not measured" in page and f"OpenMP wait policy {os.environ.get('OMP_WAIT_POLICY', 'PASSIVE')}" in page


def test_a_stored_step_time_from_another_machine_is_not_comparable_and_says_so_first(runs: dict[str, GateRun]) -> None:
    stored = runs["stored"]
    assert all(f["evidence"]["data"]["metric_id"] != "step_time.median.default" for f in stored.findings("perf-regression"))
    regression = _details(stored)["regression"]
    assert "records no commit" in regression["side_by_side_note"]
    [skipped] = regression["not_comparable"]
    assert skipped["metric_id"] == "step_time.median.default" and "another machine (CPU Another CPU @ 3.0GHz then" in skipped["reason"]
    page = (stored.out / "performance.md").read_text()
    notice = page.index("> **Not compared:**")
    assert notice < page.index("## What was measured")
    assert "neither block nor pass" in page[notice:page.index("## What was measured")]
