"""What observing the tests' training costs against the entrypoint runs it replaces.

    .venv/bin/python benchmarks/observed_tests_cost.py [TARGET] [--entrypoint TOML] [--repeat N]

TARGET (default tests/targets/observe_clean) configures no entrypoint: its test that trains is
observed. A copy gets the hand-written entrypoint that makes the same call (`--entrypoint`, the
body of `[tool.traingate.entrypoint]`; the default is observe_clean's). Both are run with every
stage, alternating, N times; printed per stage (medians of the stage's own duration, as
report.json gives it), per child run of the target's code (medians of each run's duration, as
the stage's page lists it: where the time of a stage goes), and for the whole run (wall, CLI
start-up included), with the ratio observed / configured. The execution stage runs the suite in
both; with an entrypoint it also makes the smoke call. Each run of the test is a fork of a warm
interpreter that imported torch and pytest; it starts a pytest session (the pytest plugins
installed in the environment are loaded into it: `--no-plugin-autoload` leaves them out, as the
test suite's gate runs do), collects the test's module, runs the one test and hands its result
back as soon as the test's teardown is over, without pytest's end of session. Asserts nothing;
docs/stages.md says what is observed and what it costs.

Several training loops: `--entrypoint` given once per loop (TARGET's tests train each, at
sites of their own, so the observed run observes one test per loop) compares the observed run
with the N configured runs it replaces, one a loop (an entrypoint names one training call):
each stage's duration and the wall time of the N configured runs are summed per repeat. The
per-run lines are left out then (a stage's page lists the runs of its first observed test).

    .venv/bin/python benchmarks/observed_tests_cost.py tests/targets/observe_two_loops_clean \
        --entrypoint 'call = "classifier:train_classifier"' --entrypoint 'call = "regressor:train_regressor"'
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TRAINGATE = str(Path(sys.executable).with_name("traingate"))
DEFAULT_ENTRYPOINT = 'call = "trainer:Trainer.fit"\nsetup = "traingate_setup:trainer"\nkwargs = { epochs = 1 }'
STAGES = ("execution", "performance", "concurrency", "correctness")


def gate(root: Path, out: Path) -> tuple[float, dict[str, float], str]:
    """Wall time of one run, each stage's duration and each of its child runs' (as
    "stage: label", numbered where a label repeats), and the decision."""
    started = time.perf_counter()
    subprocess.run([TRAINGATE, "run", str(root), "--out", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    wall = time.perf_counter() - started
    report = json.loads((out / "report.json").read_text())
    durations = {s["name"]: s["duration_s"] for s in report["stages"]}
    for stage in report["stages"]:
        seen: dict[str, int] = {}
        for run in (stage.get("details") or {}).get("runs") or []:
            if isinstance(run, dict) and isinstance(run.get("duration_s"), (int, float)):
                label = str(run.get("label"))
                seen[label] = seen.get(label, 0) + 1
                durations[f"  {stage['name']}: {label}" + (f" #{seen[label]}" if seen[label] > 1 else "")] = run["duration_s"]
    return wall, durations, report["decision"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", default=str(REPO / "tests" / "targets" / "observe_clean"))
    parser.add_argument("--entrypoint", action="append", help="the body of [tool.traingate.entrypoint]; once per training loop (default: observe_clean's)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--no-plugin-autoload", action="store_true",
        help="PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, as the test suite's gate runs have it: the pytest plugins of this environment "
        "(hypothesis's imports hypothesis at each run's summary) are not loaded into each run of the test",
    )
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.no_plugin_autoload:
        os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    entrypoints = args.entrypoint or [DEFAULT_ENTRYPOINT]
    with tempfile.TemporaryDirectory() as tmp:
        walls, stages, decisions = measure(Path(args.target), entrypoints, args.repeat, Path(tmp))
    autoload = "off" if args.no_plugin_autoload else "on"
    print(f"target: {args.target}  repeats: {args.repeat}  device: cpu  OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}  pytest plugin autoload: {autoload}")
    print(f"load average at the end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}  configured runs per repeat: {len(entrypoints)} (summed)")
    print(f"decisions: observed {sorted(decisions['observed'])}, configured {sorted(decisions['configured'])}")
    print(f"{'':34} {'observed (s)':>13} {'configured (s)':>15} {'ratio':>7}")
    for name in STAGES:
        runs = sorted(k for k in {*stages["observed"], *stages["configured"]} if k.startswith(f"  {name}: ")) if len(entrypoints) == 1 else []
        for key in (name, *runs):
            a, b = stages["observed"].get(key), stages["configured"].get(key)
            if a and b:
                ma, mb = statistics.median(a), statistics.median(b)
                print(f"{key:34} {ma:13.2f} {mb:15.2f} {ma / mb:7.2f}")
    ma, mb = statistics.median(walls["observed"]), statistics.median(walls["configured"])
    print(f"{'whole run':34} {ma:13.2f} {mb:15.2f} {ma / mb:7.2f}")


Samples = dict[str, list[float]]


def measure(target: Path, entrypoints: list[str], repeat: int, scratch: Path) -> tuple[Samples, dict[str, Samples], dict[str, set[str]]]:
    """The observed run and the configured runs (one per entrypoint, summed), interleaved."""
    observed = scratch / "observed"
    shutil.copytree(target, observed, ignore=shutil.ignore_patterns("__pycache__", ".git"))
    configured = []
    for n, entrypoint in enumerate(entrypoints):
        root = scratch / f"configured-{n}" / observed.name
        shutil.copytree(observed, root)
        with (root / "pyproject.toml").open("a") as toml:
            toml.write(f"\n[tool.traingate.entrypoint]\n{entrypoint}\n")
        configured.append(root)
    walls: Samples = {"observed": [], "configured": []}
    stages: dict[str, Samples] = {"observed": {}, "configured": {}}
    decisions: dict[str, set[str]] = {"observed": set(), "configured": set()}
    for i in range(repeat):
        for kind, roots in (("observed", [observed]), ("configured", configured)):
            total: dict[str, float] = {}
            wall_sum = 0.0
            for n, root in enumerate(roots):
                wall, per_stage, decision = gate(root, scratch / f"{kind}-{i}-{n}")
                wall_sum += wall
                decisions[kind].add(decision)
                for name, seconds in per_stage.items():
                    total[name] = total.get(name, 0.0) + seconds
            walls[kind].append(wall_sum)
            for name, seconds in total.items():
                stages[kind].setdefault(name, []).append(seconds)
    return walls, stages, decisions


if __name__ == "__main__":
    main()
