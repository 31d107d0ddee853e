"""One gate run's cost where an import server serves it, as in a CI queue or the test suite.

    .venv/bin/python benchmarks/served_run.py TARGET [--stages S] [--repeat 5]

Starts an import server (pipeline/supervision/import_server.py, `served_gates` of
whole_gate.py), waits for its imports, then runs `traingate run TARGET --out <tmp>
[--stages S]` N times, one after the other. Per run: the wall time, and the CPU of everything
below this process while it ran, the servers and their forks included (the gate's process, the
agents' host, the agents and their runs are the servers' children, not the command's): the
cumulative CPU of every live descendant, and of every one reaped, before and after. Printed:
each run and the medians. To compare with another checkout, run the same command with that
checkout's interpreter. Asserts nothing.

Measured on this 2-core machine (OMP_NUM_THREADS=1, medians of 5): `tests/targets/exec_suite_base
--stages execution` (a test suite, no entrypoint) took 1.69 s of wall time and 1.59 s of CPU when
its agent and its pytest started fresh (59f26d7), and 0.96 s and 0.92 s once both were forks of
a served agents' host. The same target went from 0.99 and 0.93 s of wall time (0.97 and
0.95 s of CPU) at 9974d07 to 0.66 and 0.60 s (0.66 and 0.58 s) once the run's copy of the
child side was written to memory and the gate server's imports were set aside from its forks'
collector, in two interleaved rounds; `tests/targets/conc_clip --stages concurrency` went
from 0.78-0.83 s to 0.58-0.64 s in three (the scan of loaded modules at the probes' end, 44 ms
to 4 ms, counts there too).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from whole_gate import REPO, served_gates  # this folder's

from traingate.stages.common import procstat

TICK = os.sysconf("SC_CLK_TCK")


def tree_cpu() -> float:
    """CPU seconds of every process below this one: the live ones' own and reaped children's
    (utime, stime, cutime, cstime), and those this process reaped."""
    me, parents, used = os.getpid(), {}, {}
    for entry in os.listdir("/proc"):
        fields = procstat.read_stat(entry) if entry.isdigit() else None
        if fields is not None:
            parents[int(entry)] = int(fields[1])
            used[int(entry)] = sum(int(f) for f in fields[11:15]) / TICK
    total = 0.0
    for pid, cpu in used.items():
        ancestor, hops = parents.get(pid), 0
        while ancestor and ancestor != me and hops < 64:
            ancestor, hops = parents.get(ancestor), hops + 1
        total += cpu if ancestor == me else 0.0
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + reaped.ru_utime + reaped.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", type=Path)
    parser.add_argument("--stages")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    traingate = str(Path(sys.executable).with_name("traingate"))
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as tmp, served_gates(True, Path(tmp)) as env:
        for n in range(args.repeat):
            argv = [traingate, "run", str(args.target.resolve()), "--out", f"{tmp}/out-{n}"] + (["--stages", args.stages] if args.stages else [])
            time.sleep(0.3)  # the previous run's processes reaped
            cpu, started = tree_cpu(), time.perf_counter()
            done = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True)
            wall = time.perf_counter() - started
            time.sleep(0.3)
            walls.append(wall)
            cpus.append(tree_cpu() - cpu)
            print(f"run {n + 1}: wall {wall:6.2f} s   CPU {cpus[-1]:6.2f} s   exit {done.returncode}")
    print(f"median of {args.repeat}: wall {statistics.median(walls):.2f} s   CPU {statistics.median(cpus):.2f} s")


if __name__ == "__main__":
    main()
