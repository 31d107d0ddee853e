"""What comparing the change's gate configuration with the baseline's costs, and the one more
run made where the entrypoint's configuration differs (docs/configuration.md, "The baseline's
verification is the floor").

    .venv/bin/python benchmarks/verification_floor.py [TARGET] [--repeat N]

TARGET (default examples/amp-trainer) is copied into a temporary git repository and committed;
its execution stage is run once for the baseline report. Then:
- the comparison alone, in this process: reading the baseline's configuration and inline waivers
  from git and comparing them with the change's (`verification.review` + `added_waivers`), timed
  over 20 calls, beside `load_config` of the same tree (what every run already pays);
- `traingate run TARGET --stages execution --baseline ...` (wall, CLI start-up included), N times
  alternating: the committed tree (configuration unchanged: nothing more runs) and the same tree
  with one entrypoint keyword changed (the baseline's entrypoint is smoke-called too), with the
  number of smoke calls each made and the wall time of the extra one.
Prints medians. Asserts nothing. Timings depend on the machine's load: compare within one run.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from traingate.pipeline.gate.config_file import load_config
from traingate.pipeline.gate.verification import added_waivers, review
from traingate.pipeline.model.schema import PipelineReport

REPO = Path(__file__).resolve().parent.parent
TRAINGATE = str(Path(sys.executable).with_name("traingate"))
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@example.com", "-c", "commit.gpgsign=false"]


def gate(root: Path, out: Path, *args: str) -> float:
    started = time.perf_counter()
    subprocess.run([TRAINGATE, "run", str(root), "--stages", "execution", "--out", str(out), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def comparison_ms(root: Path, baseline: PipelineReport, calls: int = 20) -> tuple[float, float]:
    """Median milliseconds of the comparison, and of loading the configuration, in this process."""
    compared, loaded = [], []
    for _ in range(calls):
        started = time.perf_counter()
        config, _ = load_config(root)
        loaded.append(time.perf_counter() - started)
        started = time.perf_counter()
        added_waivers(root, review(root, baseline, config), config)
        compared.append(time.perf_counter() - started)
    return statistics.median(compared) * 1000, statistics.median(loaded) * 1000


def smoke_runs(out: Path) -> list[dict]:
    report = json.loads((out / "report.json").read_text())
    return next(s for s in report["stages"] if s["name"] == "execution")["details"]["smoke"]["runs"]


def change_a_keyword(root: Path) -> None:
    """One keyword of the entrypoint's `kwargs` changed (the first integer one, made one larger)."""
    path = root / "pyproject.toml"
    text = path.read_text()
    line = next(line for line in text.splitlines() if line.startswith("kwargs"))
    changed = re.sub(r"= (\d+)", lambda m: f"= {int(m.group(1)) + 1}", line, count=1)
    path.write_text(text.replace(line, changed))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", default=str(REPO / "examples" / "amp-trainer"))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        unchanged, changed = scratch / "unchanged", scratch / "changed"
        shutil.copytree(Path(args.target), unchanged, ignore=shutil.ignore_patterns("__pycache__", ".git"))
        for step in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
            subprocess.run([*GIT, *step], cwd=unchanged, check=True, capture_output=True)
        gate(unchanged, scratch / "base")
        base = PipelineReport.model_validate_json((scratch / "base" / "report.json").read_text())
        compare_ms, load_ms = comparison_ms(unchanged, base)
        shutil.copytree(unchanged, changed)
        change_a_keyword(changed)
        baseline = ["--baseline", str(scratch / "base" / "report.json")]
        runs: dict[str, list[float]] = {"unchanged": [], "changed": []}
        for i in range(args.repeat):
            runs["unchanged"].append(gate(unchanged, scratch / f"u{i}", *baseline))
            runs["changed"].append(gate(changed, scratch / f"c{i}", *baseline))
        same, extra = smoke_runs(scratch / "u0"), smoke_runs(scratch / "c0")
    med = {k: statistics.median(v) for k, v in runs.items()}
    extra_wall = [r["wall_s"] for r in extra if r["label"] == "baseline-smoke"]
    print(f"target: {args.target}  repeats: {args.repeat}  (medians, wall seconds unless said)")
    print(f"  comparison (baseline config + inline waivers from git, key by key): {compare_ms:.1f} ms  (load_config of the tree: {load_ms:.1f} ms)")
    print(f"  execution stage, configuration unchanged:      {med['unchanged']:.2f} s  smoke calls: {len(same)} ({', '.join(r['label'] for r in same)})")
    print(f"  execution stage, one entrypoint keyword changed: {med['changed']:.2f} s  smoke calls: {len(extra)} ({', '.join(r['label'] for r in extra)})")
    print(f"  the baseline entrypoint's smoke call: {extra_wall[0] if extra_wall else 'not run'} s of process wall, beside the suite; ratio {med['changed'] / med['unchanged']:.2f}x")


if __name__ == "__main__":
    main()
