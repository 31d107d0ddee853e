"""How small a leak the performance stage detects, by each measure, and whether clean loops
stay clean.

    .venv/bin/python benchmarks/perf_leak_sensitivity.py [--steps 50] [--no-clean]

1. Tensor bytes: a synthetic training loop is written to a temporary folder with a leak of
   N bytes per step (a list that keeps one new float32 tensor of N/4 elements per step,
   next to ordinary per-step temporaries), profiled over 50 steps by the instrumented run
   (the same probe and the same verdict code the stage uses), and N is bisected between
   4 bytes and 64 KiB for the smallest leak the tensor-bytes measure reports. A second
   series keeps losses with their graphs (`losses.append(loss)`) to show what the classic
   leak measures per step.
2. Host memory: the same loop keeps N bytes per step outside torch (a `bytearray`, which no
   tensor measure sees), N bisected between 1 KiB and 1 MiB for the smallest leak the host
   measure reports; then a running total over a step of about 10,400 autograd nodes
   (`running_loss += loss`, past the node-count cap) with what each measure says of it.
3. False positives: the whole stage runs on the clean fixtures and the example's v6 and
   v7-fixed, and the memory-leak findings are counted (goal: 0), with each loop's tensor
   and host growth per step.
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traingate.pipeline.model.config import TargetConfig  # noqa: E402
from traingate.stages.base import StageContext, run_entrypoint  # noqa: E402
from traingate.stages.performance.probe.payloads import MemoryRecord  # noqa: E402
from traingate.stages.performance.memory import analyse  # noqa: E402

FULL = "traingate.stages.performance.probe.instrument:full"
WARMUP, MIN_STEPS = 3, 8
CLEAN = [
    "perf_clean_plain", "perf_clean_amp", "perf_bounded_cache", "perf_sync", "perf_stall", "perf_heavy_graph_clean",
    "corr_clean", "real_float64_clean", "result_files",
]

LOOP = '''
import torch
from torch import nn


def train(steps: int = 50, leak_elements: int = 0, leak_host_bytes: int = 0) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept = []
    for step in range(steps):
        x, y = torch.randn(16, 32), torch.randn(16, 1)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if leak_elements:
            kept.append(torch.zeros(leak_elements))
        if leak_host_bytes:
            kept.append(bytearray(leak_host_bytes))
    return float(loss)


def train_losses(steps: int = 50) -> float:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        loss = nn.functional.mse_loss(model(torch.randn(16, 32)), torch.randn(16, 1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss)
    return float(losses[-1])
'''


def profile(target: Path, call: str, kwargs: dict[str, Any], scratch: Path) -> dict[str, Any]:
    """The full instrument's data from one call, through the stages' own harness."""
    config = TargetConfig.model_validate({"entrypoint": {"call": call, "kwargs": kwargs}})
    ctx = StageContext(stage="performance", root=target, config=config, device="cpu", deadline=time.time() + 3600, scratch=scratch)
    run = run_entrypoint(ctx, label="profile", instruments=[FULL], options={"warmup_steps": WARMUP}, env=ctx.child_env(OMP_NUM_THREADS="1"))
    if not run.ok:
        raise SystemExit(f"{call}: the entrypoint call failed: {run.failure()}")
    return run.instrument(FULL)


def verdict(memory: dict[str, Any], scratch: Path) -> tuple[bool, dict[str, Any]]:
    ctx = StageContext(stage="performance", root=scratch, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=scratch)
    details, findings = analyse(ctx, MemoryRecord.model_validate(memory), WARMUP, MIN_STEPS, "cpu")
    return any(f.category.value == "memory-leak" for f in findings), details.verdict.model_dump(mode="json")


def measured(target: Path, kwargs: dict[str, Any], steps: int, scratch: Path) -> dict[str, Any]:
    """The combined verdict for one call of the loop: `bytes_leak` (tensor bytes) and
    `host.leak` (host memory) say which measure found it."""
    data = profile(target, "loop:train", {"steps": steps, **kwargs}, scratch)
    return verdict(data["memory"], scratch)[1]


def smallest(name: str, unit: int, low: int, high: int, found_by: Any, target: Path, steps: int, scratch: Path) -> None:
    """Bisect the leak size (`unit` bytes per count) for the smallest one `found_by` reports."""
    hit = found_by(high)
    if not hit[0]:
        print(f"  {name}: a {high * unit} bytes/step leak is not detected within {steps} steps ({hit[1]})")
        return
    while high - low > 1:
        middle = (low + high) // 2
        hit = found_by(middle)
        print(f"    leak {middle * unit:>8} bytes/step: {'detected' if hit[0] else 'missed  '} ({hit[1]})")
        if hit[0]:
            high = middle
        else:
            low = middle
    print(f"  {name}: smallest leak detected within {steps} steps: {high * unit} bytes/step (missed at {low * unit} bytes/step)")


def sensitivity(steps: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "target"
        target.mkdir()
        (target / "loop.py").write_text(LOOP)
        scratch = Path(tmp)
        clean = measured(target, {}, steps, scratch)
        print(f"no leak: reported={clean['leak']} (tensor bytes: {clean['bytes_reason']}; host: {(clean['host'] or {}).get('reason', 'not measured')})")

        def by_tensor_bytes(elements: int) -> tuple[bool, str]:
            v = measured(target, {"leak_elements": elements}, steps, scratch)
            return v["bytes_leak"], f"measured {v['slope_bytes_per_step']:.0f} bytes/step; {v['bytes_reason']}"

        def by_host_memory(kib: int) -> tuple[bool, str]:
            v = measured(target, {"leak_host_bytes": kib * 1024}, steps, scratch)
            host = v["host"] or {}
            return bool(host.get("leak")), f"measured {host.get('slope_bytes_per_step', float('nan')):.0f} bytes/step; {host.get('reason', 'not measured')}; tensor bytes leak: {v['bytes_leak']}"

        print("1. tensor bytes (float32 tensors kept in a list)")
        smallest("tensor bytes", 4, 1, 16384, by_tensor_bytes, target, steps, scratch)
        data = profile(target, "loop:train_losses", {"steps": steps}, scratch)
        hit, found = verdict(data["memory"], scratch)
        print(f"  losses.append(loss) with their graphs: measured {found['slope_bytes_per_step']:.0f} bytes/step, detected={hit}")
        print("2. host memory (bytearrays kept in a list, outside torch)")
        smallest("host memory", 1024, 1, 1024, by_host_memory, target, steps, scratch)
        heavy_graph(scratch)


def heavy_graph(scratch: Path) -> None:
    """The running total over a step past the node-count cap: what each measure says."""
    target = REPO / "tests" / "targets" / "perf_leak_heavy_graph"
    data = profile(target, "train:train", {}, scratch)
    hit, found = verdict(data["memory"], scratch)
    host = found["host"] or {}
    print(
        f"  running_loss += loss over a {data['memory']['step_graph_nodes']:,}+ node step: detected={hit}; tensor bytes "
        f"{found['slope_bytes_per_step']:.0f} bytes/step ({found['bytes_reason']}); host {host.get('slope_bytes_per_step', float('nan')):,.0f} bytes/step; "
        f"graph held by {found['nodes']['held_by']}, steps held {found['nodes'].get('steps_held')}"
    )


def false_positives() -> None:
    targets = [REPO / "tests" / "targets" / name for name in CLEAN]
    with tempfile.TemporaryDirectory() as tmp:
        for version in ("v6", "v7-fixed"):
            dest = Path(tmp) / version
            subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), version, str(dest)], check=True, capture_output=True)
            targets.append(dest)
        total = 0
        for target in targets:
            out = Path(tmp) / f"out-{target.name}"
            env = dict(os.environ, OMP_NUM_THREADS="1")
            subprocess.run([str(Path(sys.executable).with_name("traingate")), "run", str(target), "--stages", "performance", "--out", str(out), "--device", "cpu"], cwd=REPO, env=env, capture_output=True)
            report = json.loads((out / "report.json").read_text())
            leaks = [f for s in report["stages"] for f in s["findings"] if f["category"] == "memory-leak"]
            total += len(leaks)
            verdict_ = report["stages"][0]["details"].get("memory", {}).get("verdict", {})
            host = verdict_.get("host") or {}
            print(
                f"  {target.name:<24} memory-leak findings: {len(leaks)}  (tensor bytes {verdict_.get('slope_bytes_per_step', float('nan')):.1f} bytes/step, "
                f"r2 {verdict_.get('r2', float('nan')):.2f}; host {host.get('slope_bytes_per_step', float('nan')):,.0f} bytes/step)"
            )
        print(f"false positives over {len(targets)} clean loops: {total}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--no-clean", action="store_true", help="skip the false-positive runs")
    args = parser.parse_args()
    sensitivity(args.steps)
    if not args.no_clean:
        false_positives()


if __name__ == "__main__":
    main()
