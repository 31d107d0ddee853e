"""The instrumented run's cost on a loop whose autograd graph is very large.

    .venv/bin/python benchmarks/perf_heavy_graph.py [--nodes N] [--steps S] [--repeat R] [--stage]

Writes a small target (a label-model-like loop: a long chain of tiny elementwise operations,
about N autograd nodes per step, default 50,000) and prints, medians over R repeats:
- the entrypoint call bare, with the timing runs' step clock (`light`) and with the
  instrumented run's probes (`full`), and the ratios full/bare and light/bare;
- the median step time under each, and the time `full` spent at step boundaries (held bytes,
  graph counts, holder searches: `instrument_s`);
- how many steps the per-operator instruments saw: on a loop this heavy they stop once the
  window the leak and sync verdicts need is covered: warm-up + max(min_steps, 8) steps when
  those steps are steady (held memory flat, nothing retained, the same syncs every step),
  else warm-up + max(min_steps, 16); a run shorter than that window is instrumented
  throughout;
- with --stage, the stage's wall time (`traingate run --stages performance`) against the bare
  entrypoint processes it needs.
The default of 40 steps is the label model's loop this target stands for.
Every process gets OMP_NUM_THREADS=1 (see benchmarks/perf_overhead.py). Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.perf_overhead import FULL, LIGHT, harness_run, median_step, stage_wall  # noqa: E402
from traingate.pipeline.gate.config_file import load_config  # noqa: E402

# Three autograd nodes per link (mul, add, tanh).
TRAIN = '''
import torch


def train(steps: int = {steps}, links: int = {links}) -> float:
    torch.manual_seed(0)
    weights = torch.nn.Parameter(torch.randn(16) * 0.1)
    optimizer = torch.optim.SGD([weights], lr=0.01)
    votes = torch.randn(32, 16)
    last = 0.0
    for _ in range(steps):
        optimizer.zero_grad()
        h = votes
        for _ in range(links):
            h = torch.tanh(h * weights + 0.1)
        loss = h.pow(2).mean()
        loss.backward()
        optimizer.step()
        last = float(loss)
    return last
'''

CONFIG = '''[tool.traingate]
task = "heavy-graph"
timeout_s = 1800

[tool.traingate.entrypoint]
call = "train:train"
'''


def write_target(dest: Path, nodes: int, steps: int) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "train.py").write_text(TRAIN.format(steps=steps, links=max(1, nodes // 3)))
    (dest / "pyproject.toml").write_text(CONFIG)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--stage", action="store_true", help="also time the whole performance stage")
    args = parser.parse_args()
    med = statistics.median
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        target = write_target(scratch / "target", args.nodes, args.steps)
        warmup = load_config(target)[0].performance.warmup_steps
        calls: dict[str, list[float]] = {"bare": [], "light": [], "full": []}
        steps: dict[str, list[float]] = {"light": [], "full": []}
        walls: list[float] = []
        boundary_s: list[float] = []
        graph_nodes = 0
        window: dict[str, object] = {}
        for i in range(args.repeat):
            for label, instruments in (("bare", []), ("light", [LIGHT]), ("full", [FULL])):
                wall, result = harness_run(target, instruments, None, scratch, f"{label}-{i}")
                calls[label].append(result["duration_s"])
                if label == "bare":
                    walls.append(wall)
                    continue
                data = result["instruments"][instruments[0]]
                steps[label].append(median_step(data["clock"], warmup))
                if label == "full":
                    boundary_s.append(float(data.get("instrument_s") or 0.0))
                    graph_nodes = int(data["memory"].get("step_graph_nodes") or 0)
                    window = data.get("instrumentation") or {}
        bare = med(calls["bare"])
        print(f"target: {args.steps} steps, about {args.nodes:,} autograd nodes per step (measured {graph_nodes:,}{', the walk cap' if window.get('graph_walk_capped') else ''}); {args.repeat} repeat(s), cpu, OMP_NUM_THREADS=1")
        print(f"entrypoint call: bare {bare:.2f} s, light {med(calls['light']):.2f} s, full {med(calls['full']):.2f} s")
        print(f"  instrumented/bare {med(calls['full']) / bare:.2f}x, light/bare {med(calls['light']) / bare:.2f}x")
        print(f"median step: light {med(steps['light']) * 1e3:.1f} ms, full {med(steps['full']) * 1e3:.1f} ms ({med(steps['full']) / med(steps['light']):.2f}x)")
        print(f"full: {med(boundary_s):.2f} s at step boundaries (held bytes, graph counts, holder searches)")
        ended = "steady, ended early" if window.get("ended_steady") else "whole window"
        print(f"full: {window.get('ops_per_step')} operators per warm-up step; tracker and sync counter on for {window.get('instrumented_steps')} of {args.steps} steps ({ended}; full window {window.get('window_planned')})")
        if args.stage:
            config = load_config(target)[0]
            runs = 1 + config.performance.timing_runs
            stage = stage_wall(target, scratch / "stage")
            print(f"stage wall {stage:.1f} s vs {runs} bare entrypoint processes {runs * med(walls):.1f} s: {stage / (runs * med(walls)):.2f}x")
            report = scratch / "stage" / "report.json"
            performance = next((s for s in json.loads(report.read_text())["stages"] if s["name"] == "performance"), {}) if report.is_file() else {}
            print(f"  stage status {performance.get('status', 'no report')}: {performance.get('summary', '')}")


if __name__ == "__main__":
    main()
