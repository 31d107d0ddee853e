"""The environment every child run of target code gets, computed the same way by a stage agent
(for its runs) and by the gate's process (for the warm interpreter it starts for the agents,
whose imports must have seen exactly that environment)."""

from __future__ import annotations

from collections.abc import Mapping

# Environment variables of an enclosing pytest run that must not shape the target's runs.
FOREIGN_PYTEST_ENV = frozenset({"PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST", "PYTEST_XDIST_WORKER", "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"})


def _names_the_gate(name: str) -> bool:
    """The gate's own settings (`TRAINGATE_POLICY`, ...) and the shell's `_` (the command that
    started the gate): nothing the target's code needs, and each would name the gate."""
    return name == "_" or "TRAINGATE" in name.upper()


def target_env(base: Mapping[str, str], device: str, extra: Mapping[str, str] | None = None, *, unwatched: bool = False) -> dict[str, str]:
    """`base` with the device choice, a fixed hash seed, passive OpenMP waits, no bytecode written into the target's
    tree (the gate reads that tree after the run), and nothing of an enclosing pytest run (code
    that trains less under `PYTEST_CURRENT_TEST` must not do so because the gate itself runs
    in a test job).

    `unwatched`: the run compared with the watched ones (`pipeline/gate/unwatched.py`) gets
    neither the fixed hash seed nor the waiting policy, which the process's start-up
    environment (`/proc/self/environ`) would show it; only what the gate cannot leave out."""
    env = {k: v for k, v in base.items() if k not in FOREIGN_PYTEST_ENV and not _names_the_gate(k)}
    if not unwatched:
        env.setdefault("PYTHONHASHSEED", "0")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    # OpenMP threads that wait for each other by spinning measure the machine's other work: on a
    # busy machine a spinning thread that lost its core holds every other one at the barrier, and
    # the same code ran 10 times slower in wall time and CPU time alike. Passive waiting leaves
    # the cores to whoever computes; a policy the user set is kept.
    if not unwatched:
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra or {})
    return env


# What target_env sets for the runtimes to read when they start, which the child's harness
# takes out of the target's `os.environ` once they have (`stages/common/start_env.py`).
READ_AT_START = ("OMP_WAIT_POLICY",)


def read_at_start(base: Mapping[str, str]) -> list[str]:
    """The variables of `READ_AT_START` that `target_env(base, ...)` sets and `base` did not:
    the gate's own setting, not the user's, which the target may read."""
    return [name for name in READ_AT_START if name not in base]
