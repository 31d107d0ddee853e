"""A warm interpreter handed down to a stage agent that was itself forked from one.

The gate's process starts one warm interpreter for the stage agents of a run
(`pipeline/supervision/warm.py: AgentHost`): torch is imported there once, with the environment the
target's runs get, and each agent is a fork of it. Before the agent's code runs, the fork makes
a second fork of itself, which keeps torch and serves the agent's runs as a warm interpreter of
its own (`stages/harness/fork_server.py`): a child of the agent, so the orphans of the runs come
back to the agent, a subreaper, as with an interpreter the agent started. This module carries
that interpreter from the fork's code to the agent's, in the same process's memory.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InheritedWarm:
    pid: int  # a child of the process that holds this record
    socket_fd: int  # this process's end of the interpreter's request socket
    env: dict[str, str]  # the environment its imports ran with
    cwd: str


handed_down: InheritedWarm | None = None

# In the argv of a gate run's agents' host: `agents:HEX`, the module (its name in hexadecimal, as
# the agents' own modules are named: a target's process forked there shows the host's command
# line as its own) whose `prepare()` does once what every stage agent forked there would do.
_AGENTS_PRELOAD = "agents:"


def agents_preload_arg(module: str) -> str:
    return _AGENTS_PRELOAD + module.encode().hex()


def agents_preload_module(arg: str) -> str | None:
    """The module an `agents_preload_arg` names; None for any other argument."""
    return bytes.fromhex(arg[len(_AGENTS_PRELOAD):]).decode() if arg.startswith(_AGENTS_PRELOAD) else None


def take() -> InheritedWarm | None:
    """The interpreter handed down to this process, once (None when there is none)."""
    global handed_down
    found, handed_down = handed_down, None
    return found
