"""What comparing the unwatched run with the watched ones costs (docs/edited-tests.md).

    .venv/bin/python benchmarks/unwatched_cost.py [--version v7-fixed] [--repeat 3]

The comparison adds no run: the smoke call is the unwatched run. It adds, per gate run, the
interpreter the smoke call forks from (its start-up environment holds none of the gate's
settings, so it cannot share the suite's), and, per entrypoint run, the read of what the call
left (a collection and a digest of every live model's parameters). Printed: the gate's wall
time on the example and the interpreters it started, then the read's time on the example's
model, each the median of the rounds. Asserts nothing.

Measured on this 2-core CPU machine (AMD EPYC, `--repeat 3`): the gate on v7-fixed 9.7 s, with
three interpreters started (the agents' host, the concurrency stage's other hash seed, the
execution stage's unwatched smoke call); the read of what a call left, 122 ms on the example's
model (60,416 parameters; most of it the collection that drops unreachable models first).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from traingate.stages.harness.left import left_models

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="v7-fixed")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="unwatched-cost-"))
    try:
        target = work / "target"
        subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), args.version, str(target)], check=True, capture_output=True)
        walls, started = [], []
        for i in range(args.repeat):
            out = work / f"out{i}"
            begun = time.monotonic()
            subprocess.run([sys.executable, "-m", "traingate", "run", str(target), "--out", str(out), "--quiet"], check=False)
            walls.append(time.monotonic() - begun)
            started.append(sorted(p.parent.name for p in (out / "work").glob("*/warm-*.stdout")))
        print(f"gate on {args.version}: median {statistics.median(walls):.1f} s over {args.repeat} run(s); interpreters started: {started[-1]}")
        sys.path.insert(0, str(target))
        from utils.tier3_training_utilities import TinyTransformerLM  # the example's model

        model = TinyTransformerLM(vocab_size=64, d_model=64, seq_len=32)  # test_fine_tuning's defaults
        reads = []
        for _ in range(max(5, args.repeat)):
            begun = time.perf_counter()
            left = left_models(torch)
            reads.append(time.perf_counter() - begun)
        print(f"read of what a call left ({sum(m['parameters'] for m in left):,} parameters in {len(left)} model(s)): median {statistics.median(reads) * 1e3:.1f} ms")
        del model
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
