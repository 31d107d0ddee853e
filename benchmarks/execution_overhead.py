"""What the execution stage costs over running the same things by hand.

    .venv/bin/python benchmarks/execution_overhead.py [TARGET] [--version V ...] [--repeat N]

Times, on TARGET, or else on each VERSION of the example (examples/materialize.py; default the
passing v7-fixed, whose suite calls the entrypoint, and v7, whose smoke call crashes at once):
- the stage: `traingate run TARGET --stages execution --out <tmp>` (wall, CLI start-up included);
- by hand: `python -m pytest <tests>` plus one plain `python -c` that imports the entrypoint
  and calls it with the configured kwargs (once per AMP setting the stage calls), run one
  after the other;
- the test run alone through traingate's launcher, with and without coverage of the
  entrypoint's file, to show what coverage adds.
Prints medians over N repeats and the ratio stage / by hand (goal: at most 1.0x on the passing
version). Asserts
nothing. The hand-run pytest gets `--rootdir`, `--confcutdir` and `-p no:cacheprovider` so
it runs the same tests as the stage does and leaves the target as clean.
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
from traingate.pipeline.model.config import TargetConfig  # noqa: E402
from traingate.stages.execution.coverage import entrypoint_source  # noqa: E402
from traingate.stages.base import StageContext  # noqa: E402
from traingate.stages.execution.suite import run_suite  # noqa: E402


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    if done.returncode not in (0, 1):
        print(f"  (exit status {done.returncode}: {' '.join(argv[:4])} ...: {done.stderr.strip()[-300:]})")
    return elapsed


def hand_env() -> dict[str, str]:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    env.pop("PYTHONPATH", None)
    return env


def pytest_by_hand(root: Path, config: TargetConfig) -> list[str]:
    return [sys.executable, "-m", "pytest", *config.tests, f"--rootdir={root}", f"--confcutdir={root}", "-p", "no:cacheprovider", "-q"]


def entrypoint_by_hand(config: TargetConfig, amp: bool | None) -> list[str]:
    ep = config.entrypoint
    assert ep is not None
    module, _, func = ep.call.partition(":")
    kwargs = dict(ep.kwargs)
    if ep.amp_flag and amp is not None:
        kwargs[ep.amp_flag] = amp
    lines = ["import sys, importlib, json", "sys.path.insert(0, '.')", "kwargs = {}"]
    if ep.setup:
        smod, _, sfunc = ep.setup.partition(":")
        lines.append(f"kwargs.update(getattr(importlib.import_module({smod!r}), {sfunc!r})())")
    lines += [f"kwargs.update(json.loads({json.dumps(kwargs)!r}))", f"getattr(importlib.import_module({module!r}), {func!r})(**kwargs)"]
    return [sys.executable, "-c", "\n".join(lines)]


def launcher_run(root: Path, config: TargetConfig, scratch: Path, include: list[str]) -> float:
    """pytest through traingate's launcher (request on stdin, events over the checked pipe),
    with or without the coverage window: the child's wall time."""
    ctx = StageContext(stage="execution", root=root, config=config, device="cpu", deadline=time.time() + 3600, scratch=scratch)
    return run_suite(ctx, ctx.next_name("pytest"), include).child.duration_s


def materialize(version: str, dest: Path) -> Path:
    subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), version, str(dest)], check=True, capture_output=True)
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", nargs="?", type=Path)
    parser.add_argument("--version", action="append", help="a version of the example (repeatable; default v7-fixed and v7)")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    if args.target is not None:
        measure(args.target.resolve(), args.repeat)
        return
    for version in args.version or ["v7-fixed", "v7"]:
        with tempfile.TemporaryDirectory() as tmp:
            print(f"example {version}:")
            measure(materialize(version, Path(tmp) / "target"), args.repeat)
        print()


def measure(root: Path, repeat: int) -> None:
    config, _ = load_config(root)
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp_settings: list[bool | None] = [None]
    if config.entrypoint and config.entrypoint.amp_flag:
        # The stage smoke-calls both AMP settings on every device (a crash in either is a crash).
        amp_settings = [False, True]

    runs: dict[str, list[float]] = {"stage": [], "pytest": [], "entrypoint": [], "launcher": [], "launcher+coverage": []}
    source = entrypoint_source(root, config.entrypoint.call) if config.entrypoint else None
    include = [str(source.file)] if source else []
    tool_env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        for i in range(repeat):
            out = scratch / f"out-{i}"
            runs["stage"].append(timed([str(Path(sys.executable).with_name("traingate")), "run", str(root), "--stages", "execution", "--out", str(out)], REPO, tool_env))
            runs["pytest"].append(timed(pytest_by_hand(root, config), root, hand_env()))
            if config.entrypoint:
                runs["entrypoint"].append(sum(timed(entrypoint_by_hand(config, amp), root, hand_env()) for amp in amp_settings))
            runs["launcher"].append(launcher_run(root, config, scratch / f"launcher-{i}", []))
            if include:
                runs["launcher+coverage"].append(launcher_run(root, config, scratch / f"coverage-{i}", include))
        report = json.loads((scratch / "out-0" / "report.json").read_text()) if (scratch / "out-0" / "report.json").is_file() else {}

    med = {k: statistics.median(v) if v else 0.0 for k, v in runs.items()}
    by_hand = med["pytest"] + med["entrypoint"]
    print(f"target: {root}  device: {device}  repeats: {repeat}  (medians, wall seconds)")
    if report:
        print(f"  stage decision on this target: {report.get('decision')} — {report['stages'][0]['summary']}")
    print(f"  execution stage (traingate run --stages execution): {med['stage']:.2f} s")
    print(f"  by hand: python -m pytest {' '.join(config.tests)}: {med['pytest']:.2f} s + entrypoint call(s) x{len(amp_settings) if config.entrypoint else 0}: {med['entrypoint']:.2f} s = {by_hand:.2f} s")
    print(f"  ratio stage / by hand: {med['stage'] / by_hand:.2f}x (goal <= 1.0x on a passing version)")
    if include:
        print(f"  pytest through traingate's launcher: {med['launcher']:.2f} s without coverage, {med['launcher+coverage']:.2f} s with coverage of {source.rel if source else '?'}"
              f" ({med['launcher+coverage'] / med['launcher']:.2f}x)")


if __name__ == "__main__":
    main()
