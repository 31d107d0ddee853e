"""Where one gate run's CPU goes, process by process.

    .venv/bin/python benchmarks/gate_processes.py TARGET [--stages S] [--repeat N] [--before TRAINGATE]

Runs `traingate run TARGET --out <tmp> [--stages S]` (this install's, and with `--before`
another install's executable, interleaved, N times each) and samples /proc every 10 ms for
every process under it: its command line, its parent, its CPU (user + system) as last seen.
A process forked without an exec (an agent forked from the agents' host, a run forked from a
warm interpreter) shows its parent's command line; it is named by what it forked from
("fork of ..."). Printed per side: the median wall time and CPU of the whole tree (the CPU
of every process reaped under it, exact) and, for the last repetition, each process's CPU
and lifetime as sampled (a process that lived under 10 ms may be missed, and each one's last
10 ms may be: the sampled sum is at most the exact total). Asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from whole_gate import children_cpu  # this folder's: the CPU of every process reaped under this one

from traingate.stages.common import procstat

REPO = Path(__file__).resolve().parent.parent
TICK = os.sysconf("SC_CLK_TCK")


@dataclass
class Seen:
    pid: int
    ppid: int
    label: str
    first: float
    last: float
    cpu: float
    tag: str = ""


def read_stat(pid: int) -> tuple[int, float, int] | None:
    """(ppid, CPU seconds, start time in ticks) of `pid`, or None when it is gone."""
    fields = procstat.read_stat(pid)
    if fields is None:
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK, int(fields[19])


def read_cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in raw.split(b"\0") if part)


def run_tag(pid: int) -> str:
    """The run tag in the environment block of `pid` (`<ROOT>_RUN_TAG`), or ""."""
    try:
        block = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return ""
    for entry in block.split(b"\0"):
        name, _, value = entry.partition(b"=")
        if name.endswith(b"_RUN_TAG"):
            return value.decode(errors="replace").strip()
    return ""


def short(cmdline: str) -> str:
    words = cmdline.split()
    if "-m" in words:
        module = words[words.index("-m") + 1]
        return f"-m {module}"
    if "-c" in words:
        return "-c ..."
    return " ".join(Path(w).name if "/" in w else w for w in words[:3])[:60]


def sample(root: int, seen: dict[tuple[int, int], Seen], now: float) -> None:
    stats: dict[int, tuple[int, float, int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = read_stat(int(entry))
            if got is not None:
                stats[int(entry)] = got
    inside = {root}
    changed = True
    while changed:
        changed = False
        for pid, (ppid, _, _) in stats.items():
            if pid not in inside and ppid in inside:
                inside.add(pid)
                changed = True
    by_pid = {key[0]: s for key, s in seen.items()}
    for pid in inside:
        ppid, cpu, start = stats[pid]
        key = (pid, start)
        if key in seen:
            seen[key].cpu, seen[key].last = cpu, now
            if now - seen[key].first < 0.3:  # a fork writes its run's tag soon after it starts
                seen[key].tag = run_tag(pid) or seen[key].tag
            continue
        cmd = short(read_cmdline(pid))
        parent = by_pid.get(ppid)
        label = f"fork of [{parent.pid}]" if parent is not None and short(read_cmdline(ppid)) == cmd else cmd
        seen[key] = Seen(pid, ppid, label, now, now, cpu, run_tag(pid))
        by_pid[pid] = seen[key]


def one_run(traingate: str, target: Path, stages: str | None) -> tuple[float, float, list[Seen], str]:
    out = Path(tempfile.mkdtemp(prefix="gate-proc-"))
    argv = [traingate, "run", str(target), "--out", str(out / "out")] + (["--stages", stages] if stages else [])
    seen: dict[tuple[int, int], Seen] = {}
    cpu0, started = children_cpu(), time.perf_counter()
    child = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    while child.poll() is None:
        sample(child.pid, seen, time.perf_counter() - started)
        time.sleep(0.01)
    wall, cpu = time.perf_counter() - started, children_cpu() - cpu0
    decision = "?"
    report = out / "out" / "report.json"
    if report.is_file():
        import json

        decision = json.loads(report.read_text()).get("decision", "?")
    else:
        decision = f"exit {child.returncode}: {(child.stderr.read() if child.stderr else '')[-300:]}"
    shutil.rmtree(out, ignore_errors=True)
    return wall, cpu, sorted(seen.values(), key=lambda s: s.first), decision


def show_tree(processes: list[Seen]) -> None:
    print(f"  {'pid':>7} {'ppid':>7} {'start':>6} {'life':>6} {'cpu':>6}  process")
    for p in processes:
        print(f"  {p.pid:>7} {p.ppid:>7} {p.first:6.2f} {p.last - p.first:6.2f} {p.cpu:6.2f}  {p.label}  {p.tag}")
    print(f"  sampled sum {sum(p.cpu for p in processes):.2f} s over {len(processes)} processes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("target", type=Path)
    parser.add_argument("--stages")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--before", help="another install's traingate executable, timed interleaved")
    parser.add_argument("--quiet", action="store_true", help="totals only, no process table")
    args = parser.parse_args()
    sides = {"this": str(Path(sys.executable).parent / "traingate")}
    if args.before:
        sides = {"before": args.before, **sides}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    for rep in range(args.repeat):
        order = list(sides.items())
        if rep % 2:
            order.reverse()
        for name, exe in order:
            wall, cpu, processes, decision = one_run(exe, args.target.resolve(), args.stages)
            results[name].append((wall, cpu))
            print(f"{name} #{rep + 1}: wall {wall:.2f} s, CPU {cpu:.2f} s, {decision}", flush=True)
            if not args.quiet and rep == args.repeat - 1:
                show_tree(processes)
    load = os.getloadavg()[0]
    for name, runs in results.items():
        walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
        print(f"{name}: median wall {statistics.median(walls):.2f} s, median CPU {statistics.median(cpus):.2f} s ({len(runs)} runs, load {load:.1f})")


if __name__ == "__main__":
    main()
