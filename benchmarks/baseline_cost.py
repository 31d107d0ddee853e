"""What judging a change against its base costs, as ratios to a run without a baseline.

    .venv/bin/python benchmarks/baseline_cost.py [--target examples/amp-trainer] [--repeat 3]

Builds a git repository from TARGET (the base commit), commits a one-line change on top, then
times, in interleaved rounds: the change with no baseline; with `--baseline REPORT_JSON` (the
base's report made beforehand, today's two-step run); with `--baseline HEAD~1` whose report is
kept (read from `--reports`); and with `--baseline HEAD~1` verified in the run (an empty
`--reports`). Prints each round and the medians as ratios to the run without a baseline; the
goals (docs/ci.md) are: kept ≈ the two-step run, verified ≤ the two runs. Asserts nothing.

Measured on this 2-core CPU machine (AMD EPYC, `--target` the example's v7-fixed materialized,
`--repeat 2`): no baseline 9.6 s; two-step 1.17x; revision, kept 1.20x; revision, verified 2.22x.
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

REPO = Path(__file__).resolve().parents[1]
TRAINGATE = [sys.executable, "-m", "traingate"]
GIT = ["git", "-c", "user.name=b", "-c", "user.email=b@example.com", "-c", "commit.gpgsign=false"]


def _timed(argv: list[str]) -> float:
    started = time.monotonic()
    subprocess.run(argv, capture_output=True, text=True, check=False)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", type=Path, default=REPO / "examples" / "amp-trainer")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="baseline-cost-"))
    try:
        repo = work / "repo"
        shutil.copytree(args.target, repo)
        subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
        subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
        subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "base"], check=True)
        (repo / "CHANGE.md").write_text("a change that touches no code\n")
        subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
        subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "change"], check=True)
        kept = work / "kept"
        base_report = work / "base-report.json"
        # The base's report, made once: what the two-step run and the kept store start from.
        subprocess.run([*TRAINGATE, "run", str(repo), "--out", str(work / "o"), "--baseline", "HEAD~1", "--reports", str(kept), "--quiet"], check=False)
        found = next(kept.rglob("report.json"))
        shutil.copy(found, base_report)
        runs = {
            "no baseline": lambda i: [*TRAINGATE, "run", str(repo), "--out", str(work / f"a{i}"), "--quiet"],
            "two-step (--baseline REPORT_JSON)": lambda i: [*TRAINGATE, "run", str(repo), "--out", str(work / f"b{i}"), "--baseline", str(base_report), "--quiet"],
            "revision, report kept": lambda i: [*TRAINGATE, "run", str(repo), "--out", str(work / f"c{i}"), "--baseline", "HEAD~1", "--reports", str(kept), "--quiet"],
            "revision, base verified in the run": lambda i: [*TRAINGATE, "run", str(repo), "--out", str(work / f"d{i}"), "--baseline", "HEAD~1", "--reports", str(work / f"empty{i}"), "--quiet"],
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for i in range(args.repeat):
            for name, argv in runs.items():
                times[name].append(_timed(argv(i)))
            print(f"round {i + 1}: " + ", ".join(f"{name} {t[-1]:.1f} s" for name, t in times.items()), flush=True)
        floor = statistics.median(times["no baseline"])
        print(f"\nmedians over {args.repeat} round(s), {args.target.name}:")
        for name, values in times.items():
            median = statistics.median(values)
            print(f"  {name:40} {median:7.1f} s  {median / floor:5.2f}x")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
