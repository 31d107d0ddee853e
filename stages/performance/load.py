"""What else the machine did while a timing run ran, and which machine it was.

A step time measured on a busy machine is the machine's, not the code's: a shared CI runner, or
a second gate run beside this one, can make the same code many times slower. So each timing run
is bracketed by two readings of `/proc/stat` (the CPU time every process spent, all cores) and
`/proc/loadavg`, read by the stage's own process, which the target cannot write to. The CPU time
the other processes took is the machine's busy time less the timing run's own (its process CPU
time, as its probe reads it), as a share of all the cores over the run's wall time. A run is
quiet when that share is at most QUIET_SHARE.

The machine's identity (CPU model and the cores this process may use, the device, the torch
build) and the OpenMP wait policy of the runs (passive unless the user set one:
stages/contract/target_env.py) are recorded beside it: a step time stored in another report is
compared only with one measured on the same machine (stages/performance/regression.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from traingate.stages.common.procstat import usable_cpus
from traingate.stages.performance.details import LoadRecord, MachineRecord

# Other processes' CPU time, as a share of all cores, at or under which a run counts as quiet.
QUIET_SHARE = 0.1
_PROC = Path("/proc")


@dataclass(frozen=True)
class CpuSample:
    """One reading: seconds since an arbitrary start, busy and total CPU ticks over all cores."""

    at: float
    busy_ticks: int | None
    total_ticks: int | None
    loadavg: float | None


def sample(proc: Path = _PROC) -> CpuSample:
    busy, total = _stat_ticks(proc)
    return CpuSample(time.monotonic(), busy, total, _loadavg(proc))


def load_between(before: CpuSample, after: CpuSample, own_cpu_s: float | None, cpus: int, tick_hz: float | None = None) -> LoadRecord:
    """The load other processes put on the machine between two readings, `own_cpu_s` being the
    timing run's own CPU time (None where the run did not report it: then every busy tick counts)."""
    wall = max(after.at - before.at, 1e-9)
    share = None
    if before.busy_ticks is not None and after.busy_ticks is not None and cpus > 0:
        hz = tick_hz or _tick_hz()
        busy_s = (after.busy_ticks - before.busy_ticks) / hz
        other_s = max(0.0, busy_s - (own_cpu_s or 0.0))
        share = round(min(1.0, other_s / (cpus * wall)), 4)
    return LoadRecord(
        wall_s=round(wall, 3),
        other_cpu_share=share,
        own_cpu_s=round(own_cpu_s, 3) if own_cpu_s is not None else None,
        loadavg=after.loadavg,
        quiet=share is not None and share <= QUIET_SHARE,
    )


def machine(device: str, torch_build: str | None, device_name: str | None, proc: Path = _PROC, wait_policy: str | None = None) -> MachineRecord:
    """The machine a timing ran on, as far as the stage's process can tell without torch, and
    the OpenMP wait policy its timing runs had."""
    return MachineRecord(cpu_model=_cpu_model(proc), cpus=usable_cpus(), device=device, device_name=device_name, torch=torch_build, omp_wait_policy=wait_policy)


def _tick_hz() -> float:
    try:
        return float(os.sysconf("SC_CLK_TCK"))
    except (ValueError, OSError, AttributeError):
        return 100.0


def _stat_ticks(proc: Path) -> tuple[int | None, int | None]:
    """(busy, total) ticks of the aggregate `cpu` line; busy leaves out idle and iowait."""
    try:
        first = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None, None
    if not first or first[0] != "cpu":
        return None, None
    try:
        # user nice system idle iowait irq softirq steal (guest time is inside user already)
        ticks = [int(v) for v in first[1:9]]
    except ValueError:
        return None, None
    ticks += [0] * (8 - len(ticks))
    total = sum(ticks)
    return total - ticks[3] - ticks[4], total


def _loadavg(proc: Path) -> float | None:
    try:
        return float((proc / "loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _cpu_model(proc: Path) -> str | None:
    try:
        for line in (proc / "cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        return None
    return None
