"""Wall time of the concurrency stage over the bare entrypoint runs it needs.

    python benchmarks/concurrency_overhead.py [--version v7-fixed --version v7] [--repeat 3]

For each VERSION (repeatable; default the passing v7-fixed and v7, whose entrypoint crashes at
once), the example target (examples/materialize.py VERSION) is written to a temporary folder; then,
per repetition, `traingate run --stages concurrency` runs on it, and as many bare runs as the
stage made: plain `python -c` calls of the entrypoint with the same kwargs and environment,
no harness, no instruments. Printed: the stage's own duration (its agent process, as in
report.json), the CLI's wall time, the bare runs' total, and their ratio (goal <= 1.3x).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traingate.pipeline.gate.config_file import load_config  # noqa: E402

GOAL = 1.3


def materialize(version: str, dest: Path) -> Path:
    subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), version, str(dest)], check=True, capture_output=True)
    return dest


def bare_env(hash_seed: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    import torch

    if not torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def bare_run(target: Path, hash_seed: str) -> float:
    """One plain call of the configured entrypoint, as the stage's runs call it."""
    config, _ = load_config(target)
    ep = config.entrypoint
    assert ep is not None, "the example has no entrypoint"
    module, _, function = ep.call.partition(":")
    kwargs = dict(ep.kwargs)
    if ep.amp_flag:
        kwargs[ep.amp_flag] = True
    code = (
        f"import sys, torch; sys.path.insert(0, '.'); torch.manual_seed({ep.seed:d})\n"
        f"from {module} import {function} as f\nf(**{kwargs!r})\n"
    )
    started = time.perf_counter()
    # Not checked: on a version whose entrypoint crashes, the bare run crashes the same way.
    subprocess.run([sys.executable, "-c", code], cwd=target, env=bare_env(hash_seed), capture_output=True)
    return time.perf_counter() - started


def stage_run(target: Path, out: Path) -> tuple[float, float, list[dict[str, object]]]:
    started = time.perf_counter()
    done = subprocess.run(
        [str(Path(sys.executable).with_name("traingate")), "run", str(target), "--stages", "concurrency", "--out", str(out)],
        cwd=REPO, capture_output=True, text=True,
    )
    wall = time.perf_counter() - started
    report = json.loads((out / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "concurrency")
    if done.returncode not in (0, 1):
        raise SystemExit(f"traingate failed ({done.returncode}): {done.stderr[-2000:]}")
    return float(stage["duration_s"]), wall, stage["details"].get("runs", [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="append", help="a version of the example (repeatable; default v7-fixed and v7)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for version in args.version or ["v7-fixed", "v7"]:
        measure(version, args.repeat)


def measure(version: str, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = materialize(version, Path(tmp) / "target")
        stage_s, cli_s, bare_s, ratios = [], [], [], []
        for index in range(repeat):
            duration, wall, runs = stage_run(target, Path(tmp) / f"out{index}")
            bare = sum(bare_run(target, str(r.get("hash_seed", "0"))) for r in runs)
            stage_s.append(duration)
            cli_s.append(wall)
            bare_s.append(bare)
            ratios.append(duration / bare)
            print(f"repeat {index + 1}: stage {duration:.2f}s ({len(runs)} runs: {', '.join(str(r['label']) for r in runs)}), CLI {wall:.2f}s, bare runs {bare:.2f}s, ratio {duration / bare:.2f}x", flush=True)
        ratio = statistics.median(ratios)
        print(f"\nexample {version}, {repeat} repetition(s), medians:")
        print(f"  concurrency stage     {statistics.median(stage_s):7.2f} s")
        print(f"  traingate CLI (wall)  {statistics.median(cli_s):7.2f} s")
        print(f"  bare entrypoint runs  {statistics.median(bare_s):7.2f} s")
        print(f"  ratio stage / bare    {ratio:7.2f}x  (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'missed'})")


if __name__ == "__main__":
    main()
