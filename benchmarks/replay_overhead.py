"""What replaying the baseline's form of changed tests adds to the execution stage.

    .venv/bin/python benchmarks/replay_overhead.py [TARGET] [--test-file PATH] [--repeat N]

TARGET (default examples/amp-trainer) is copied into a temporary git repository and committed;
its execution stage is run once for the baseline report. Then, against that baseline, times
`traingate run TARGET --stages execution --baseline ...` (wall, CLI start-up included):
- unchanged: the committed tree (no test code changed, nothing replayed);
- one test file changed: PATH (default: the first test file of the baseline) with a line
  added, so that its tests run again in their baseline form beside the suite.
Prints medians over N repeats, alternating the two, and the ratio (goal: at most 1.3x).
Asserts nothing. docs/edited-tests.md says what the replay does.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAINGATE = str(Path(sys.executable).with_name("traingate"))
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c", "commit.gpgsign=false"]


def gate(root: Path, out: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([TRAINGATE, "run", str(root), "--stages", "execution", "--out", str(out), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", default=str(REPO / "examples" / "amp-trainer"))
    parser.add_argument("--test-file", default=None)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        unchanged, changed = scratch / "unchanged", scratch / "changed"
        shutil.copytree(Path(args.target), unchanged, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
            subprocess.run([*GIT, *step], cwd=unchanged, check=True, capture_output=True)
        gate(unchanged, scratch / "base")
        base_report = json.loads((scratch / "base" / "report.json").read_text())
        execution = next(s for s in base_report["stages"] if s["name"] == "execution")
        test_file = args.test_file or sorted({t["path"] for t in execution["tests"] if t.get("path")})[0]
        shutil.copytree(unchanged, changed)
        with (changed / test_file).open("a") as f:
            f.write("\n# changed\n")
        baseline = ["--baseline", str(scratch / "base" / "report.json")]
        runs: dict[str, list[float]] = {"unchanged": [], "changed": []}
        for i in range(args.repeat):
            runs["unchanged"].append(gate(unchanged, scratch / f"u{i}", *baseline))
            runs["changed"].append(gate(changed, scratch / f"c{i}", *baseline))
        report = json.loads((scratch / "c0" / "report.json").read_text())
    replay = next(s for s in report["stages"] if s["name"] == "execution")["details"]["pytest"]["accounting"]["replay"]
    med = {k: statistics.median(v) for k, v in runs.items()}
    print(f"target: {args.target}  repeats: {args.repeat}  (medians, wall seconds)")
    print(f"  execution stage, no test changed:          {med['unchanged']:.2f} s")
    print(f"  execution stage, {test_file} changed: {med['changed']:.2f} s  ({len(replay['tests'])} test(s) replayed in {replay['duration_s']} s)")
    print(f"  ratio: {med['changed'] / med['unchanged']:.2f}x (goal <= 1.3x)")


if __name__ == "__main__":
    main()
