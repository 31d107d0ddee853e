"""Which stages of a run go side by side, on the cores this process may use.

Every stage runs on its own copy of the target in its own agent, so two stages can run at once;
what orders them is what a stage's result means for the next ones and what its runs measure:
- a stage that runs whatever happened before it (`purpose` None: the execution stage, which
  finds out whether the training function can run at all) runs alone, before the ones after it;
- a stage that times its runs (`times_runs`: the performance stage) starts a group: its timed
  runs come first, alone, and the others of its group start once it says they are done
  (`StageContext.machine_released`), beside the rest of its work. Its timed runs share no core
  with another stage's work, and nothing else waits for them;
- the others run side by side, as many at once as the cores hold their runs' threads
  (`side_by_side`), the next starting when one ends: each stage keeps one run busy at a time,
  and a run computes on OMP_NUM_THREADS intra-op threads, torch's default being one per core.
  More threads than cores would have every run's threads wait on the others': without
  OMP_NUM_THREADS set, the stages run one after another however many cores there are.
With one core every stage runs alone, in the registry's order. A stage of a group that an
earlier stage of the same group would have skipped is still skipped in the report
(`orchestrator`): its run is discarded, so the report is the one the stages in order write.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from traingate.pipeline.model.registry import Stage, parts


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, which a CI runner or `taskset` may
    narrow), not the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity mask on this platform
        return os.cpu_count() or 1


def side_by_side(cores: int, env: Mapping[str, str]) -> int:
    """How many stages may run at once on `cores`, with the runs' environment `env`."""
    return max(1, cores // run_threads(cores, env.get("OMP_NUM_THREADS")))


def run_threads(cores: int, setting: str | None) -> int:
    """The intra-op threads of one run: OMP_NUM_THREADS (its first level, as OpenMP reads a
    list), else torch's default, one per core."""
    first = (setting or "").split(",")[0].strip()
    return int(first) if first.isdigit() and int(first) > 0 else cores


def stage_groups(names: Sequence[str], registry: dict[str, Stage], width: int) -> list[list[str]]:
    """`names`, in their order, cut into groups whose stages may run side by side, at most
    `width` at once (the orchestrator's pool); a stage that times its runs is first in its group."""
    groups: list[list[str]] = []
    group: list[str] = []
    for name in names:
        stage = parts(registry[name])
        if width < 2 or not stage.needs_training:
            groups += [group, [name]] if group else [[name]]
            group = []
        elif stage.times_runs:
            groups += [group] if group else []
            group = [name]
        else:
            group.append(name)
    return groups + ([group] if group else [])


def timed_first(group: Sequence[str], registry: dict[str, Stage]) -> bool:
    """Whether the group's first stage times its runs: the others wait until it releases the machine."""
    return bool(group) and parts(registry[group[0]]).times_runs
