"""The whole gate against the least the mission needs on the same target: its floor.

    .venv/bin/python benchmarks/whole_gate.py [--version v7-fixed] [--target DIR [--overlay DIR]] [--repeat 3] [--before TRAINGATE]

The example target (examples/materialize.py VERSION, default v7-fixed: four stages, PASS) is
written to a temporary folder, or TARGET is used as it is; with `--overlay`, TARGET (a real
repo as fetched) is copied to a temporary folder and the overlay's files (its
`traingate.toml`, a setup module) are copied over the copy and committed there, so the fetched
tree itself is never edited. Per repetition, interleaved:
- the gate: `traingate run TARGET --out <tmp>` with every stage (wall, CLI start-up included),
  each stage's duration as report.json records it, and each entrypoint or test run a stage
  lists in its page's details (stage/label: seconds, as that stage records it);
- with `--import-server`, the gate again with its agents' host forked by an import server
  this process keeps, and the `traingate` process itself a fork of its gate server
  (pipeline/supervision/import_server.py, pipeline/gate/gate_server.py: a queue of gate runs pays
  the torch import and the command line's once);
- the floor: the target's suite once as a bare `python -m pytest -q` in its folder, and the
  configured entrypoint three times as bare `python -c` processes with the configured seed
  and kwargs: AMP off, AMP on (where an AMP flag is configured) and a same-seed repeat of the
  first, one after the other.
`--before` times a second gate, another install's `traingate` executable, in the same
repetitions (a change against the code before it, on one machine under one load).
The order of the sides rotates between repetitions, so a machine whose load drifts
weighs on every side alike. Printed: medians per stage and in total, the floor's parts, the
CPU seconds of every side (steadier than wall time on a loaded machine), and the ratio
gate / floor in wall time (goal <= 1.3x on the example). The processes inherit this process's
environment (set OMP_NUM_THREADS the same for both sides). Asserts nothing.

Measured on a heavy real repo, milesial/Pytorch-UNet at 21d7850 with the configuration of
docs/real-repos.md (12 optimizer steps of a U-Net on 32x32 images, `tests = false`, AMP flag
`amp`), on the shared 2-core CPU runner under a load average of 10 to 14 from other jobs,
OMP_NUM_THREADS=1, one repetition (a second did not fit the time there was), the three sides
one after the other: the gate 1099 s (CPU 393 s), the gate before the smoke calls ran side by
side 1183 s (CPU 456 s), the floor 255 s (CPU 111 s: AMP off 49 s, AMP on 164 s, same-seed
repeat 42 s): **4.3x** its floor in wall time (3.5x in CPU), against 4.6x before; the goal of
1.5x is not met. Where it goes: on a CPU, AMP on is bfloat16 autocast computed in software, 4 to 5
times an AMP-off call, and the gate makes five or six AMP-on runs (the AMP-on smoke call 239 s,
the performance stage's instrumented run 212 s and AMP timing run 258 s, the concurrency
stage's instrumented run 286 s and its rerun, the correctness stage's instrumented run 310 s,
the last two groups side by side) where the floor makes one; the AMP-off smoke call (56 s) and
timing run (41 s) are what the floor's AMP-off runs cost. The execution stage: 260 s with its
two smoke calls side by side, 240 s one after the other before (the load moved more than that
between the two). That run's concurrency stage ran out of its 600 s budget before its rerun (a
blocking stage-error, so its CPU is one run short); the one before fitted it.
What sharing runs between stages could reach there, from the same figures: the mission still
needs one timed AMP-on run and one instrumented AMP-on run (the GradScaler protocol and the
training are observed as configured), where the floor makes one AMP-on run. With every other
run shared (each smoke call also its setting's timing run, one instrumented run read by the
three observing stages, the same-seed comparison made between the instrumented AMP-on run and
the timed one), the gate would make 164 + 164 + 49 = 377 s of bare runs (1.48x) before the
instruments' own cost, and about 164 + 212 + 49 = 425 s (1.67x) at the instrumented run's
measured cost (212 s against 164 s bare): 1.5x on this repo on a CPU needs the instrumented
run within about 1.1x of a bare one, or AMP-on runs that cost less than this CPU's software
bfloat16 (a GPU's).
Measured again on the same repo and configuration on a quiet machine (load average under 2,
OMP_NUM_THREADS=1, one repetition, a venv with pillow, numpy and tqdm beside torch 2.13.0):
the gate 332 s (CPU 415 s: execution 59, performance 136, concurrency 134, correctness 73 side
by side with it; AMP-off smoke call 9, AMP-on 59, instrumented AMP-on runs 64, 69 and 73,
AMP-on timing run 61, same-seed rerun 65), the floor 102 s (AMP off 16, AMP on 71, repeat 15):
**3.26x** in wall time (4.06x in CPU). With every run shared as above, the same figures give
71 + 69 + 16 = 156 s, 1.53x: on this CPU, this repo stays at about 1.5x even then.
With the performance stage's timed runs first and alone, and the concurrency and correctness
stages starting beside its instrumented run once it releases the machine (pipeline/gate/schedule.py),
measured against the code before it (`--before`, a clone at d7442bd with the same packages) in
one repetition on a quiet machine (load average under 1.3, OMP_NUM_THREADS=1): the gate 275.6 s
(CPU 416.6 s), the gate before 332.3 s (CPU 417.5 s), the floor 89.6 s (AMP off 13.9, AMP on
62.9, repeat 12.8): **3.08x** against 3.71x before, the same CPU in less wall time. What is left
is the runs themselves: execution 62.6 s (its two smoke calls side by side, the AMP-on one
62.4 s), the timed runs alone 70 s (AMP off 9.6, AMP on 60.4), then 138 s for the instrumented
run (63.4 s), the concurrency stage's two runs (65.7 + 68.3 s) and the correctness stage's
(75.1 s) on two cores: 271 CPU-s over two cores. Below that, only fewer runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from traingate.pipeline.gate.config_file import load_config  # noqa: E402
from traingate.pipeline.model.config import TargetConfig  # noqa: E402
from traingate.pipeline.gate.torch_probe import torch_facts  # noqa: E402
from traingate.pipeline.supervision import import_server  # noqa: E402

GOAL = 1.3


def materialize(version: str, dest: Path) -> Path:
    subprocess.run([sys.executable, str(REPO / "examples" / "materialize.py"), version, str(dest)], check=True, capture_output=True)
    return dest


def overlaid(target: Path, overlay: Path, dest: Path) -> Path:
    """A copy of `target` with `overlay`'s files over it, committed, so that the gate's
    snapshot and its version label see them as the repo's own."""
    shutil.copytree(target, dest, symlinks=True)
    shutil.copytree(overlay, dest, dirs_exist_ok=True)
    git = ["git", "-C", str(dest), "-c", "user.name=bench", "-c", "user.email=bench@localhost"]
    if (dest / ".git").exists():
        subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
        subprocess.run([*git, "commit", "-q", "-m", "traingate configuration"], check=True, capture_output=True)
    return dest


def bare_env() -> dict[str, str]:
    """What the gate's own runs get that changes what the target does: the hash seed, no
    bytecode written, and the CPU when no GPU is there (the gate picks the device the same way)."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("PYTHONPATH", None)
    import torch

    if not torch.cuda.is_available():
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


CPU: dict[str, float] = {}  # CPU seconds (user + system) of the last process `timed` or `gate` ran, its descendants included


def children_cpu() -> float:
    """CPU seconds of every process this one has waited for, and of theirs: the gate and each
    agent reap what they start (they are subreapers), so a run's whole tree is counted."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - started
    CPU["last"] = children_cpu() - cpu
    if done.returncode not in (0, 1):
        print(f"  (exit status {done.returncode}: {' '.join(argv[:3])} ...: {done.stderr.strip()[-300:]})", flush=True)
    return elapsed


def entrypoint_code(config: TargetConfig, amp: bool | None) -> str:
    """Python source calling the configured entrypoint as the stages call it: seeded, the
    setup's kwargs under the configured ones, the AMP flag set when `amp` is not None."""
    ep = config.entrypoint
    assert ep is not None and ep.call, "the target has no callable entrypoint"
    module, _, function = ep.call.partition(":")
    kwargs = dict(ep.kwargs)
    if ep.amp_flag and amp is not None:
        kwargs[ep.amp_flag] = amp
    lines = ["import importlib, json, sys, torch", "sys.path.insert(0, '.')", f"torch.manual_seed({ep.seed:d})", "kwargs = {}"]
    if ep.setup:
        smod, _, sfunc = ep.setup.partition(":")
        lines.append(f"kwargs.update(getattr(importlib.import_module({smod!r}), {sfunc!r})())")
    lines += [f"kwargs.update(json.loads({json.dumps(kwargs)!r}))", f"getattr(importlib.import_module({module!r}), {function!r})(**kwargs)"]
    return "\n".join(lines)


def floor_runs(config: TargetConfig) -> list[tuple[str, bool | None]]:
    ep = config.entrypoint
    if ep is None:
        return []
    if not ep.amp_flag:
        return [("entrypoint", None), ("same-seed repeat", None)]
    return [("entrypoint AMP off", False), ("entrypoint AMP on", True), ("same-seed repeat", False)]


def floor(target: Path, config: TargetConfig, env: dict[str, str]) -> dict[str, float]:
    """The bare processes, one after the other: {part: wall seconds}."""
    parts: dict[str, float] = {}
    cpu = 0.0
    if config.has_test_suite:
        parts["pytest -q"] = timed([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *config.tests], target, env)
        cpu += CPU["last"]
    for label, amp in floor_runs(config):
        parts[label] = timed([sys.executable, "-c", entrypoint_code(config, amp)], target, env)
        cpu += CPU["last"]
    CPU["last"] = cpu
    return parts


def gate(traingate: str, target: Path, out: Path, env: dict[str, str] | None = None) -> tuple[float, dict[str, float], str]:
    """The whole gate: wall seconds, each stage's recorded duration, the decision."""
    cpu = children_cpu()
    started = time.perf_counter()
    done = subprocess.run([traingate, "run", str(target), "--out", str(out)], cwd=REPO, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - started
    CPU["last"] = children_cpu() - cpu
    report_file = out / "report.json"
    if done.returncode not in (0, 1) or not report_file.is_file():
        raise SystemExit(f"traingate failed ({done.returncode}): {done.stderr[-2000:]}")
    report = json.loads(report_file.read_text())
    parts = {s["name"]: float(s["duration_s"]) for s in report["stages"]}
    for stage in report["stages"]:
        for label, seconds in listed_runs(stage.get("details") or {}):
            key = f"  {stage['name']}/{label}"
            while key in parts:  # a label listed twice (two runs of one setting)
                key += "'"
            parts[key] = seconds
    return wall, parts, str(report["decision"])


def listed_runs(details: object) -> list[tuple[str, float]]:
    """Every run a stage's details list: a record with a `label` and its time (`wall_s`, the
    child's wall time, where the stage records it, else `duration_s`), in the order listed."""
    found: list[tuple[str, float]] = []
    if isinstance(details, dict):
        seconds = details.get("wall_s", details.get("duration_s"))
        if isinstance(details.get("label"), str) and isinstance(seconds, (int, float)):
            found.append((details["label"], float(seconds)))
        for value in details.values():
            found += listed_runs(value)
    elif isinstance(details, list):
        for item in details:
            found += listed_runs(item)
    return found


@dataclass
class Side:
    """One thing timed each repetition: a gate (its `traingate` executable) or the floor."""

    name: str
    traingate: str | None = None  # None: the floor
    env: dict[str, str] | None = None  # the gate's environment, where not this process's
    walls: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)  # per stage, or per bare process
    decision: str = ""

    def measure(self, target: Path, config: TargetConfig, env: dict[str, str], out: Path) -> None:
        if self.traingate is None:
            parts = floor(target, config, env)
            wall = sum(parts.values())
        else:
            wall, parts, self.decision = gate(self.traingate, target, out, self.env)
        self.walls.append(wall)
        self.cpu.append(CPU["last"])
        for name, seconds in parts.items():
            self.parts.setdefault(name, []).append(seconds)

    def show(self) -> None:
        med = statistics.median
        what = "one after the other" if self.traingate is None else f"per stage (report.json), {self.decision}"
        print(f"  {self.name}, {what}:")
        for part, seconds in self.parts.items():
            print(f"    {part:<40} {med(seconds):7.2f}")
        print(f"    {'total (wall)':<40} {med(self.walls):7.2f}   CPU {med(self.cpu):7.2f}")


@contextlib.contextmanager
def served_gates(wanted: bool, folder: Path) -> Iterator[dict[str, str] | None]:
    """With `wanted`, an import server (pipeline/supervision/import_server.py) for gates started
    with this process's environment, kept until the end, and that environment naming it. Its
    side's CPU is the `traingate` caller's only: the gate's process, its host, the agents and
    their runs are the servers' children (their imports are paid once, before the first
    repetition)."""
    if not wanted:
        yield None
        return
    socket_path = folder / "import-server.socket"
    served_env = {**os.environ, import_server.SERVER_ENV: str(socket_path)}
    server = import_server.start(socket_path, served_env, "cuda" if torch_facts().cuda else "cpu")
    try:
        if not import_server.wait_ready(socket_path, server):
            raise SystemExit(f"the import server did not start: {(folder / 'import-server.stderr').read_text()[-2000:]}")
        yield served_env
    finally:
        import_server.stop(server)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", default="v7-fixed")
    parser.add_argument("--target", type=Path, help="a target folder instead of the example")
    parser.add_argument("--overlay", type=Path, help="with --target: files copied over a copy of it (its traingate.toml, a setup module)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--before", help="another traingate executable (an earlier install) timed in the same repetitions")
    parser.add_argument("--import-server", action="store_true", help="also time the gate served by an import server this process keeps (its command and its agents' host forked from it)")
    args = parser.parse_args()
    env = bare_env()
    sides = [Side("gate", str(Path(sys.executable).with_name("traingate"))), Side("floor")]
    if args.before:
        sides.insert(1, Side("gate before", args.before))
    with tempfile.TemporaryDirectory() as tmp, served_gates(args.import_server, Path(tmp)) as served_env:
        if served_env is not None:
            sides.insert(1, Side("gate served", sides[0].traingate, served_env))
        if args.target and args.overlay:
            target = overlaid(args.target.resolve(), args.overlay.resolve(), Path(tmp) / args.target.resolve().name)
        else:
            target = args.target.resolve() if args.target else materialize(args.version, Path(tmp) / "target")
        config, _ = load_config(target)
        for index in range(args.repeat):
            # Each repetition starts with another side, so a drifting load weighs on all alike.
            for side in sides[index % len(sides):] + sides[:index % len(sides)]:
                side.measure(target, config, env, Path(tmp) / f"out-{side.name.replace(' ', '-')}-{index}")
            floor_wall = sides[-1].walls[-1]
            print(f"repeat {index + 1}: " + ", ".join(f"{s.name} {s.walls[-1]:.2f} s (CPU {s.cpu[-1]:.2f} s, {s.walls[-1] / floor_wall:.2f}x)" for s in sides), flush=True)
            for side in sides:  # this repetition's parts, for a run cut short
                print(f"  {side.name}: " + ", ".join(f"{part.strip()} {seconds[-1]:.1f}" for part, seconds in side.parts.items()), flush=True)
    name = target.name if args.target else f"example {args.version}"
    print(f"\n{name}, {args.repeat} interleaved repetition(s), cpus here: {len(os.sched_getaffinity(0))}, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, medians (seconds):")
    for side in sides:
        side.show()
    floor_side = sides[-1]
    for side in sides[:-1]:
        ratio = statistics.median(w / f for w, f in zip(side.walls, floor_side.walls, strict=True))
        cpu = statistics.median(side.cpu) / statistics.median(floor_side.cpu)
        print(f"  {side.name} / floor: {ratio:.2f}x wall (median of the repetitions' ratios), {cpu:.2f}x CPU  (goal <= {GOAL}x wall: {'met' if ratio <= GOAL else 'missed'})")


if __name__ == "__main__":
    main()
