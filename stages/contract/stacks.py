"""The stack-dump file every child writes (`traingate.stages.contract.guard`) and the parent
reads (`traingate.pipeline.isolation`): faulthandler's format, with traingate's own header
lines. Both sides take the header lines from here, so the format lives in one place.
"""

from __future__ import annotations

import re

# The environment variable naming the file a child appends its stack dumps to.
STACKS_ENV = "TRAINGATE_STACKS_FILE"
# The environment variable naming the run_child call a process descends from
# (`traingate.pipeline.isolation`); a fork of a warm interpreter writes its own into its
# environment block (`traingate.stages.harness.warm`).
RUN_TAG_ENV = "TRAINGATE_RUN_TAG"

# No name of the gate in it: the target's processes write it (docs/edited-tests.md).
_PREFIX = "# dump"

# Written once, first: which thread of which process is the main one.
MAIN_HEADER = re.compile(rf"^{_PREFIX} main pid (\d+) thread (0x[0-9a-f]+)$", re.M)
# Written right before the stack of a call that ends the process itself (os.kill, os._exit...).
SELF_SIGNAL_HEADER = re.compile(rf"^{_PREFIX} self-signal (.*) pid (\d+)$", re.M)
# Where a stack to locate a crash starts: our self-signal note, or faulthandler's fatal-error line.
CRASH_MARK = re.compile(rf"^(?:{_PREFIX} self-signal .*|Fatal Python error: .*)$", re.M)


def main_header(pid: int, thread_ident: int) -> str:
    return f"{_PREFIX} main pid {pid} thread {thread_ident:#x}\n"


def self_signal_header(what: str, pid: int) -> str:
    """`what`: the signal's name (SIGKILL) or the call (`os._exit(0)`)."""
    return f"{_PREFIX} self-signal {what} pid {pid}\n"
