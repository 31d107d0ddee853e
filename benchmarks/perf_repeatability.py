"""How repeatable the performance stage's timing figures are.

    .venv/bin/python benchmarks/perf_repeatability.py [TARGET] [--runs 5] [--threads T]

Runs `traingate run TARGET --stages performance` RUNS times (TARGET defaults to the example
materialized as v7-fixed, which has an AMP flag) and prints, for the measured AMP speedup
and each timing run's median step time: every value, the mean, and the coefficient of
variation (standard deviation / mean). Each process gets OMP_NUM_THREADS=T (default 1).
Asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def stage_metrics(target: Path, out: Path, threads: str) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS=threads)
    subprocess.run([str(Path(sys.executable).with_name("traingate")), "run", str(target), "--stages", "performance", "--out", str(out)], cwd=REPO, env=env, capture_output=True)
    report = json.loads((out / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "performance")
    return {m["name"]: m["value"] for m in stage["metrics"] if isinstance(m["value"], (int, float)) and not isinstance(m["value"], bool)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--threads", default="1")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        target = args.target.resolve() if args.target else Path(tmp) / "target"
        if not args.target:
            subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), "v7-fixed", str(target)], check=True, capture_output=True)
        runs = [stage_metrics(target, Path(tmp) / f"out-{i}", args.threads) for i in range(args.runs)]
    names = [n for n in runs[0] if n.startswith("AMP speedup") or n.startswith("step time, median")]
    print(f"target: {target}  ({args.runs} stage runs, OMP_NUM_THREADS={args.threads})")
    for name in names:
        values = [r[name] for r in runs if name in r]
        mean = statistics.fmean(values)
        cv = statistics.stdev(values) / mean if len(values) > 1 and mean else float("nan")
        print(f"{name}: {', '.join(f'{v:.3f}' for v in values)}  mean {mean:.3f}  CV {cv:.1%}")


if __name__ == "__main__":
    main()
