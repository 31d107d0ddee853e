"""Wall time of the correctness stage over the bare entrypoint runs it needs.

    python benchmarks/correctness_overhead.py [--version v7-fixed --version v7] [--repeat 3]
    python benchmarks/correctness_overhead.py --target tests/targets/corr_clean [--heavy] [--repeat 3]
    python benchmarks/correctness_overhead.py --target tests/targets/corr_ddp_clean --repeat 3

Without --target or --heavy, each VERSION of the example is measured (examples/materialize.py;
default the passing v7-fixed and v7, whose entrypoint crashes at once).
Per repetition, `traingate run --stages correctness` runs on the target, then the same runs
bare: plain `python -c` calls of the entrypoint with each run's kwargs (the configured ones,
and for the gradient-accumulation runs the accumulated and the large-batch kwargs), no
harness, no instruments. The stage ends its gradient-accumulation runs after the first
optimizer step while their bare counterparts train to the end, so the ratio over all runs
flatters the stage a little; the instrumented run against its own bare run does not.
`--heavy` writes a target with a 4M-parameter MLP and 60 steps, where the per-step cost of
the parameter fingerprints shows rather than process start-up.
A target with a `[tool.traingate.distributed]` section gets, for the stage's distributed run,
one bare distributed run instead: `python -m torch.distributed.run --standalone
--nproc-per-node N` on a script that calls the entrypoint with the configured kwargs
(OMP_NUM_THREADS=1, torchrun's own default for more than one rank, set to keep its warning out).
`--baseline` gives every repetition the report of a first, untimed stage run on the same target
as `--baseline` (the training facts compared, docs/baseline-comparison.md).
Printed: the stage's duration (its agent process, as in report.json), the bare runs' total,
the instrumented run against its bare run, the distributed run (the stage's harness child)
against the bare torchrun run where there is one, and the ratios (goal <= 1.5x).
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
from traingate.stages.correctness.config import DISTRIBUTED, DistributedConfig  # noqa: E402

GOAL = 1.5
# torch's gloo teardown can abort a rank at interpreter exit after the training finished (the
# stage's ranks never reach that teardown); such a bare torchrun run is tried again.
TEARDOWN_ABORT = "terminate called without an active exception"
DISTRIBUTED_TRIES = 3
# The example's v7 crashes in its entrypoint: its bare runs crash the same way, and that is timed.
CRASH_ALLOWED: list[bool] = []

HEAVY_PYPROJECT = """[tool.traingate]
task = "CORR-HEAVY"
timeout_s = 600

[tool.traingate.entrypoint]
call = "train:train"
kwargs = { steps = 60 }
"""
HEAVY_TRAIN = """import torch


def train(steps: int = 60) -> float:
    model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU()) for _ in range(4)], torch.nn.Linear(1024, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(64, 1024), torch.randn(64, 1)
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return loss.item()
"""


def bare_code(target: Path, kwargs: dict[str, object]) -> str:
    """Python source that calls the configured entrypoint with `kwargs` over the configured ones."""
    config, _ = load_config(target)
    ep = config.entrypoint
    assert ep is not None and ep.call, "the target has no callable entrypoint"
    module, _, function = ep.call.partition(":")
    merged = {**ep.kwargs, **kwargs}
    return f"import sys, torch; sys.path.insert(0, '.'); torch.manual_seed({ep.seed:d})\nfrom {module} import {function} as f\nf(**{merged!r})\n"


def timed(argv: list[str], target: Path, **extra_env: str) -> float:
    """Wall time of `argv` run in the target's folder, on the CPU."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "CUDA_VISIBLE_DEVICES": "", **extra_env}
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=target, env=env, capture_output=True, text=True)
    if done.returncode != 0 and not CRASH_ALLOWED:
        raise subprocess.CalledProcessError(done.returncode, argv, done.stdout, done.stderr)
    return time.perf_counter() - started


def bare_run(target: Path, kwargs: dict[str, object]) -> float:
    """One plain call of the configured entrypoint with `kwargs` over the configured ones."""
    return timed([sys.executable, "-c", bare_code(target, kwargs)], target)


def bare_distributed_run(target: Path, nproc: int, script: Path) -> float:
    """The configured entrypoint under torchrun with `nproc` ranks, as `torchrun --standalone`
    starts it; `script` is written here (torchrun runs a file, not `-c`)."""
    script.write_text(bare_code(target, {}))
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", str(script)]
    attempt = 1
    while True:
        try:
            return timed(argv, target, OMP_NUM_THREADS="1")
        except subprocess.CalledProcessError as failed:
            if TEARDOWN_ABORT not in failed.stderr or attempt == DISTRIBUTED_TRIES:
                raise SystemExit(f"bare torchrun run failed ({failed.returncode}): {failed.stderr[-2000:]}") from failed
            print(f"  (bare torchrun try {attempt}: a rank aborted at exit, {TEARDOWN_ABORT!r}; trying again)", flush=True)
            attempt += 1


def stage_run(target: Path, out: Path, baseline: Path | None = None) -> tuple[float, list[dict[str, object]]]:
    compared = ["--baseline", str(baseline)] if baseline is not None else []
    done = subprocess.run(
        [str(Path(sys.executable).with_name("traingate")), "run", str(target), "--stages", "correctness", "--device", "cpu", "--out", str(out), *compared],
        cwd=REPO, capture_output=True, text=True,
    )
    if done.returncode not in (0, 1):
        raise SystemExit(f"traingate failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads((out / "report.json").read_text())
    stage = next(s for s in report["stages"] if s["name"] == "correctness")
    return float(stage["duration_s"]), stage["details"].get("runs", [])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", type=Path)
    parser.add_argument("--version", action="append", help="a version of the example (repeatable; default v7-fixed and v7)")
    parser.add_argument("--heavy", action="store_true")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--baseline", action="store_true", help="compare every repetition with a first run's report")
    args = parser.parse_args()
    if args.target is not None or args.heavy:
        measure(args.target.resolve() if args.target else None, args)
        return
    for version in args.version or ["v7-fixed", "v7"]:
        CRASH_ALLOWED[:] = [version == "v7"]
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / "target"
            subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), version, str(target)], check=True, capture_output=True)
            print(f"example {version}:", flush=True)
            measure(target, args, f"example {version}")
        print()


def measure(given: Path | None, args: argparse.Namespace, label: str = "") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        target = given or Path(tmp)
        if args.heavy:
            target = Path(tmp) / "heavy"
            target.mkdir()
            (target / "pyproject.toml").write_text(HEAVY_PYPROJECT)
            (target / "train.py").write_text(HEAVY_TRAIN)
        distributed = load_config(target)[0].optional_section(DISTRIBUTED, DistributedConfig)
        script = Path(tmp) / "bare_distributed.py"
        stage_s, bare_s, ratios, first_ratios, distributed_ratios = [], [], [], [], []
        baseline = None
        if args.baseline:
            stage_run(target, Path(tmp) / "baseline")
            baseline = Path(tmp) / "baseline" / "report.json"
        for index in range(args.repeat):
            duration, runs = stage_run(target, Path(tmp) / f"out{index}", baseline)
            if not runs:
                print(f"repeat {index + 1}: stage {duration:.2f}s, no run recorded", flush=True)
                continue
            bare_runs = [
                bare_distributed_run(target, distributed.nproc, script) if distributed is not None and r["label"] == "distributed"
                else bare_run(target, dict(r.get("kwargs") or {}))  # type: ignore[call-overload]
                for r in runs
            ]
            bare = sum(bare_runs)
            instrumented = float(runs[0]["duration_s"])  # type: ignore[arg-type]
            stage_s.append(duration)
            bare_s.append(bare)
            ratios.append(duration / bare)
            first_ratios.append(instrumented / bare_runs[0])
            print(
                f"repeat {index + 1}: stage {duration:.2f}s ({len(runs)} runs: {', '.join(str(r['label']) for r in runs)}), bare runs {bare:.2f}s, "
                f"ratio {duration / bare:.2f}x; instrumented run {instrumented:.2f}s vs bare {bare_runs[0]:.2f}s ({instrumented / bare_runs[0]:.2f}x)",
                flush=True,
            )
            for run, bare_one in zip(runs, bare_runs, strict=True):
                if distributed is not None and run["label"] == "distributed":
                    staged = float(run["duration_s"])  # type: ignore[arg-type]
                    distributed_ratios.append(staged / bare_one)
                    print(f"  distributed run {staged:.2f}s vs bare torchrun {bare_one:.2f}s ({staged / bare_one:.2f}x)", flush=True)
        if not ratios:
            return
        ratio = statistics.median(ratios)
        compared = ", against a baseline" if args.baseline else ""
        print(f"\ntarget {'heavy MLP' if args.heavy else label or target.name}, {args.repeat} repetition(s){compared}, medians:")
        print(f"  correctness stage         {statistics.median(stage_s):7.2f} s")
        print(f"  bare entrypoint runs      {statistics.median(bare_s):7.2f} s")
        print(f"  instrumented run / bare   {statistics.median(first_ratios):7.2f}x")
        if distributed is not None and distributed_ratios:
            print(f"  distributed run / torchrun{statistics.median(distributed_ratios):7.2f}x  ({distributed.nproc} ranks, {len(distributed_ratios)} of {args.repeat} repetition(s))")
        print(f"  ratio stage / bare        {ratio:7.2f}x  (goal <= {GOAL}x: {'met' if ratio <= GOAL else 'missed'})")


if __name__ == "__main__":
    main()
