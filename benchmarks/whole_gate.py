"""The whole gate against the least the mission needs on the same target: its floor.

    .venv/bin/python benchmarks/whole_gate.py [--version v7-fixed] [--target DIR] [--repeat 3]

The example target (examples/materialize.py VERSION, default v7-fixed: four stages, PASS) is
written to a temporary folder, or TARGET is used as it is. Per repetition, interleaved:
- the gate: `traingate run TARGET --out <tmp>` with every stage (wall, CLI start-up included),
  and each stage's duration as report.json records it;
- the floor: the target's suite once as a bare `python -m pytest -q` in its folder, and the
  configured entrypoint three times as bare `python -c` processes with the configured seed
  and kwargs: AMP off, AMP on (where an AMP flag is configured) and a same-seed repeat of the
  first, one after the other.
The order of gate and floor alternates between repetitions, so a machine whose load drifts
weighs on both alike. Printed: medians per stage and in total, the floor's parts, the CPU
seconds of both sides (steadier than wall time on a loaded machine), and the ratio
gate / floor in wall time (goal <= 1.3x on the example). The processes inherit this process's
environment (set OMP_NUM_THREADS the same for both sides). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traingate.pipeline.gate.config_file import load_config  # noqa: E402
from traingate.pipeline.model.config import TargetConfig  # noqa: E402

GOAL = 1.3


def materialize(version: str, dest: Path) -> Path:
    subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), version, str(dest)], check=True, capture_output=True)
    return dest


def bare_env() -> dict[str, str]:
    """What the gate's own runs get that changes what the target does: the hash seed, no
    bytecode written, and the CPU when no GPU is there (the gate picks the device the same way)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    import torch

    if not torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


CPU: dict[str, float] = {}  # CPU seconds (user + system) of the last process `timed` or `gate` ran, its descendants included


def children_cpu() -> float:
    """CPU seconds of every process this one has waited for, and of theirs: the gate and each
    agent reap what they start (they are subreapers), so a run's whole tree is counted."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    CPU["last"] = children_cpu() - cpu
    if done.returncode not in (0, 1):
        print(f"  (exit status {done.returncode}: {' '.join(argv[:3])} ...: {done.stderr.strip()[-300:]})", flush=True)
    return elapsed


def entrypoint_code(config: TargetConfig, amp: bool | None) -> str:
    """Python source calling the configured entrypoint as the stages call it: seeded, the
    setup's kwargs under the configured ones, the AMP flag set when `amp` is not None."""
    ep = config.entrypoint
    assert ep is not None and ep.call, "the target has no callable entrypoint"
    module, _, function = ep.call.partition(":")
    kwargs = dict(ep.kwargs)
    if ep.amp_flag and amp is not None:
        kwargs[ep.amp_flag] = amp
    lines = ["import importlib, json, sys, torch", "sys.path.insert(0, '.')", f"torch.manual_seed({ep.seed:d})", "kwargs = {}"]
    if ep.setup:
        smod, _, sfunc = ep.setup.partition(":")
        lines.append(f"kwargs.update(getattr(importlib.import_module({smod!r}), {sfunc!r})())")
    lines += [f"kwargs.update(json.loads({json.dumps(kwargs)!r}))", f"getattr(importlib.import_module({module!r}), {function!r})(**kwargs)"]
    return "\n".join(lines)


def floor_runs(config: TargetConfig) -> list[tuple[str, bool | None]]:
    ep = config.entrypoint
    if ep is None:
        return []
    if not ep.amp_flag:
        return [("entrypoint", None), ("same-seed repeat", None)]
    return [("entrypoint AMP off", False), ("entrypoint AMP on", True), ("same-seed repeat", False)]


def floor(target: Path, config: TargetConfig, env: dict[str, str]) -> dict[str, float]:
    """The bare processes, one after the other: {part: wall seconds}."""
    parts: dict[str, float] = {}
    cpu = 0.0
    if config.has_test_suite:
        parts["pytest -q"] = timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *config.tests], target, env)
        cpu += CPU["last"]
    for label, amp in floor_runs(config):
        parts[label] = timed([sys.executable, "-c", entrypoint_code(config, amp)], target, env)
        cpu += CPU["last"]
    CPU["last"] = cpu
    return parts


def gate(target: Path, out: Path) -> tuple[float, dict[str, float], str]:
    """The whole gate: wall seconds, each stage's recorded duration, the decision."""
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run([str(Path(sys.executable).with_name("traingate")), "run", str(target), "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    CPU["last"] = children_cpu() - cpu
    report_file = out / "report.json"
    if done.returncode not in (0, 1) or not report_file.is_file():
        raise SystemExit(f"traingate failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(report_file.read_text())
    return wall, {s["name"]: float(s["duration_s"]) for s in report["stages"]}, str(report["decision"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="v7-fixed")
    parser.add_argument("--target", type=Path, help="a target folder instead of the example")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    env = bare_env()
    med = statistics.median
    with tempfile.TemporaryDirectory() as tmp:
        target = args.target.resolve() if args.target else materialize(args.version, Path(tmp) / "target")
        config, _ = load_config(target)
        walls: list[float] = []
        stages: dict[str, list[float]] = {}
        parts: dict[str, list[float]] = {}
        totals: list[float] = []
        cpu: dict[str, list[float]] = {"gate": [], "floor": []}
        decision = ""
        for index in range(args.repeat):
            order = ("gate", "floor") if index % 2 == 0 else ("floor", "gate")
            for side in order:
                if side == "gate":
                    wall, durations, decision = gate(target, Path(tmp) / f"out{index}")
                    walls.append(wall)
                    for name, seconds in durations.items():
                        stages.setdefault(name, []).append(seconds)
                else:
                    measured = floor(target, config, env)
                    for name, seconds in measured.items():
                        parts.setdefault(name, []).append(seconds)
                    totals.append(sum(measured.values()))
                cpu[side].append(CPU["last"])
            print(f"repeat {index + 1}: gate {walls[-1]:.2f} s ({decision}), floor {totals[-1]:.2f} s, ratio {walls[-1] / totals[-1]:.2f}x; CPU gate {cpu['gate'][-1]:.2f} s, floor {cpu['floor'][-1]:.2f} s", flush=True)
    name = target.name if args.target else f"example {args.version}"
    print(f"\n{name}, {args.repeat} interleaved repetition(s), cpus here: {len(os.sched_getaffinity(0))}, medians (wall seconds):")
    print("  the gate, per stage (report.json):")
    for stage, seconds in stages.items():
        print(f"    {stage:<28} {med(seconds):7.2f}")
    print(f"    {'whole gate (CLI wall)':<28} {med(walls):7.2f}")
    print("  the floor, one after the other:")
    for part, seconds in parts.items():
        print(f"    {part:<28} {med(seconds):7.2f}")
    print(f"    {'floor total':<28} {med(totals):7.2f}")
    ratio = med(w / t for w, t in zip(walls, totals, strict=True))
    print(f"  CPU seconds (processes and their descendants): gate {med(cpu['gate']):.2f}, floor {med(cpu['floor']):.2f}, ratio {med(cpu['gate']) / med(cpu['floor']):.2f}x")
    print(f"  ratio gate / floor (median of the repetitions' ratios) {ratio:.2f}x  (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'missed'})")


if __name__ == "__main__":
    main()
