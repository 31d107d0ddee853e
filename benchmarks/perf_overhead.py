"""What the performance stage's instruments cost, and what the stage costs over bare runs.

    .venv/bin/python benchmarks/perf_overhead.py [TARGET] [--version V ...] [--repeat N] [--threads T]

Without TARGET, each VERSION of the example (examples/materialize.py; default the passing
v7-fixed, then v7, whose entrypoint crashes at once). Prints, for a target whose call passes:
- the entrypoint call's duration with no instrument, with the timing runs' step clock
  (`light`) and with the instrumented run's probes (`full`), and their ratios;
- the median step time under `full` against `light` (the instrumented step / the step as
  the timing runs see it);
- the cost per step boundary of the alternative the tracker replaces: a `gc.get_objects()`
  walk summing live tensor storages, and the bytes it finds against the tracker's count;
- the stage's wall time (`traingate run --stages performance`) against the bare entrypoint
  processes it needs (one per run it makes), run one after the other.
For a target whose call fails, only the last line: the stage against one bare process.
Medians over N repeats. Every process gets OMP_NUM_THREADS=T (default 1): on a small
shared machine, several torch processes with one intra-op thread per core each slow each
other down by an order of magnitude and the ratios would measure that. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traingate.pipeline.gate.config_file import load_config  # noqa: E402
from traingate.stages.base import StageContext, run_entrypoint  # noqa: E402

LIGHT = "traingate.stages.performance.probe.instrument:light"
FULL = "traingate.stages.performance.probe.instrument:full"
GC_WALK = "benchmarks.perf_overhead:GcWalkProbe"
THREADS = ["1"]


class GcWalkProbe:
    """The step clock plus, at every step boundary, a walk of all objects for tensors."""

    def install(self, ctx: Any) -> None:
        from traingate.stages.performance.probe.clock import StepClock
        from traingate.stages.performance.probe.frame_index import FrameIndex

        self.walks: list[tuple[float, int]] = []
        self.clock = StepClock(FrameIndex(ctx.root), read_loss=lambda t: float(t))
        self.clock.listeners.append(self._walk)
        self.clock.install()

    def _walk(self, _: int) -> None:
        import torch

        started = time.perf_counter()
        seen: set[int] = set()
        total = 0
        for obj in gc.get_objects():
            if isinstance(obj, torch.Tensor):
                try:
                    storage = obj.untyped_storage()
                except Exception:  # noqa: BLE001
                    continue
                if storage._cdata not in seen:
                    seen.add(storage._cdata)
                    total += storage.nbytes()
        self.walks.append((time.perf_counter() - started, total))

    def collect(self) -> dict[str, Any]:
        return {"walk_s": [w for w, _ in self.walks], "bytes": [b for _, b in self.walks], "objects": len(gc.get_objects())}


def harness_run(target: Path, instruments: list[str], amp: bool | None, scratch: Path, name: str, must_pass: bool = True) -> tuple[float, dict[str, Any]]:
    """One call of the entrypoint through the stages' own harness (request on stdin, result
    over the checked pipe): the wall time of the child and its result."""
    config, _ = load_config(target)
    ctx = StageContext(stage="performance", root=target, config=config, device="cpu", deadline=time.time() + 3600, scratch=scratch / name)
    # PYTHONPATH: the benchmark's own instrument (GC_WALK) lives in this file.
    env = ctx.child_env(OMP_NUM_THREADS=THREADS[0], PYTHONPATH=str(REPO))
    run = run_entrypoint(ctx, label=name, amp=amp, instruments=instruments, options={"warmup_steps": config.performance.warmup_steps}, env=env)
    if not run.ok and must_pass:
        raise SystemExit(f"{name}: the entrypoint call failed: {run.failure()}")
    return run.child.duration_s, run.result or {}


def median_step(clock: dict[str, Any], warmup: int) -> float:
    steps = clock["host"]["step"][warmup:]
    return statistics.median(steps) if steps else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", default="1", help="OMP_NUM_THREADS for every process")
    parser.add_argument("--version", action="append", help="a version of the example (repeatable; default v7-fixed and v7)")
    args = parser.parse_args()
    THREADS[0] = args.threads
    if args.target is not None:
        measure(args.target.resolve(), args)
        return
    for version in args.version or ["v7-fixed", "v7"]:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"example {version}:", flush=True)
            measure(materialize(Path(tmp) / "target", version), args)
        print()


def measure(target: Path, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        config, _ = load_config(target)
        if not config.entrypoint or not harness_run(target, [], None, scratch, "probe", must_pass=False)[1].get("ok", False):
            early_failing(target, args.repeat, scratch)
            return
        warmup = config.performance.warmup_steps
        amp = True if config.entrypoint and config.entrypoint.amp_flag else None
        calls: dict[str, list[float]] = {"bare": [], "light": [], "full": []}
        walls: dict[str, list[float]] = {"bare": []}
        steps: dict[str, list[float]] = {"light": [], "full": []}
        walk_ms: list[float] = []
        found: list[tuple[int, int]] = []
        for i in range(args.repeat):
            for label, instruments in (("bare", []), ("light", [LIGHT]), ("full", [FULL])):
                wall, result = harness_run(target, instruments, amp, scratch, f"{label}-{i}")
                calls[label].append(result["duration_s"])
                if label == "bare":
                    walls["bare"].append(wall)
                else:
                    clock = result["instruments"][instruments[0]]["clock"]
                    steps[label].append(median_step(clock, warmup))
                    if label == "full":
                        memory = result["instruments"][FULL]["memory"]["held_bytes"]
                        tracked = int(statistics.median(memory)) if memory else 0
            _, walked = harness_run(target, [GC_WALK], amp, scratch, f"gc-{i}")
            data = walked["instruments"][GC_WALK]
            walk_ms += [w * 1e3 for w in data["walk_s"][warmup:]]
            found.append((int(statistics.median(data["bytes"])) if data["bytes"] else 0, tracked))
        stage_walls = [stage_wall(target, scratch / f"stage-{i}") for i in range(args.repeat)]
        runs = 3 if amp else 2
        med = statistics.median
        print(f"target: {target}  ({args.repeat} repeats, cpu, OMP_NUM_THREADS={args.threads})")
        print(f"entrypoint call: bare {med(calls['bare']):.3f} s, light {med(calls['light']):.3f} s, full {med(calls['full']):.3f} s")
        print(f"  call ratio light/bare {med(calls['light']) / med(calls['bare']):.2f}x, full/bare {med(calls['full']) / med(calls['bare']):.2f}x")
        print(f"median step: light {med(steps['light']) * 1e3:.3f} ms, full {med(steps['full']) * 1e3:.3f} ms, instrumented/timing {med(steps['full']) / med(steps['light']):.2f}x")
        print(f"gc.get_objects() walk per step boundary: median {med(walk_ms):.2f} ms (max {max(walk_ms):.2f} ms)")
        print(f"  bytes it finds (median) {statistics.median(f for f, _ in found):,} vs tracker's held bytes {statistics.median(t for _, t in found):,}")
        print(f"stage wall {med(stage_walls):.2f} s vs {runs} bare entrypoint processes {runs * med(walls['bare']):.2f} s: {med(stage_walls) / (runs * med(walls['bare'])):.2f}x")


def stage_wall(target: Path, out: Path) -> float:
    started = time.perf_counter()
    env = dict(os.environ, OMP_NUM_THREADS=THREADS[0])
    subprocess.run([str(Path(sys.executable).with_name("traingate")), "run", str(target), "--stages", "performance", "--out", str(out), "--device", "cpu"], cwd=REPO, env=env, capture_output=True)
    return time.perf_counter() - started


def early_failing(target: Path, repeat: int, scratch: Path) -> None:
    """A target whose call fails: the stage, whose first run fails, against one bare process."""
    stage_walls, bare = [], []
    for i in range(repeat):
        stage_walls.append(stage_wall(target, scratch / f"stage-{i}"))
        bare.append(harness_run(target, [], None, scratch, f"bare-{i}", must_pass=False)[0])
    med = statistics.median
    print(f"target: {target}  ({repeat} repeats; its entrypoint call fails)")
    print(f"stage wall {med(stage_walls):.2f} s vs 1 bare entrypoint process {med(bare):.2f} s: {med(stage_walls) / med(bare):.2f}x")


def materialize(dest: Path, version: str = "v7-fixed") -> Path:
    subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), version, str(dest)], check=True, capture_output=True)
    return dest


if __name__ == "__main__":
    main()
