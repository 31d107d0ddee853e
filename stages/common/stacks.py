"""The stack-dump file every child writes (`stages/common/guard.py`) and the parent
reads (`pipeline/supervision/isolation.py`): faulthandler's format, with the gate's own header
lines, and its parser. Both sides take the format from here, so it lives in one place.
"""

from __future__ import annotations

import re
from dataclasses import dataclass



def stacks_env_of(root: str) -> str:
    """The environment variable naming the file a child appends its stack dumps to, in a
    process that runs these modules under the package `root`."""
    return f"{root.upper()}_STACKS_FILE"


def run_tag_env_of(root: str) -> str:
    """The environment variable naming the run_child call a process descends from
    (`pipeline/supervision/isolation.py`; a fork of a warm interpreter writes its own into its
    environment block, `stages/harness/fork_server.py`), as `stacks_env_of` names it."""
    return f"{root.upper()}_RUN_TAG"


# Named after the package these modules run as: the gate's own in its processes, the random
# name of a run's copy in the target's (docs/edited-tests.md), so a plain copy names no gate.
STACKS_ENV = stacks_env_of(__name__.split(".")[0])
RUN_TAG_ENV = run_tag_env_of(__name__.split(".")[0])

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


@dataclass(frozen=True)
class Frame:
    """One frame of a dumped stack."""

    path: str
    line: int
    function: str


_THREAD_RE = re.compile(r"^(?:(?:Current thread|Thread) (0x[0-9a-f]+)|Stack) \(most recent call first\)", re.M)
_FRAME_RE = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def parse_dump(text: str) -> list[tuple[str, list[Frame]]]:
    """faulthandler's dump: [(thread id, frames innermost first)] in file order."""
    threads: list[tuple[str, list[Frame]]] = []
    for line in text.splitlines():
        head = _THREAD_RE.match(line)
        if head:
            threads.append((head.group(1) or "", []))
            continue
        frame = _FRAME_RE.match(line)
        if frame and threads:
            threads[-1][1].append(Frame(frame.group(1), int(frame.group(2)), frame.group(3).strip()))
    return threads


def main_thread_frames(stacks: str) -> list[Frame]:
    header = MAIN_HEADER.search(stacks)
    threads = parse_dump(stacks[header.end():] if header else stacks)
    if not threads:
        return []
    if header:
        wanted = int(header.group(2), 16)
        for ident, frames in threads:
            if ident and int(ident, 16) == wanted:
                return frames
    return threads[0][1]


def crash_frames(stacks: str) -> list[Frame]:
    """Frames (innermost first) of the stack dumped when the process killed itself or died
    of a fatal signal; empty when it left no trace (an outside SIGKILL)."""
    marks = [m.end() for m in CRASH_MARK.finditer(stacks)]
    if not marks:
        return []
    threads = parse_dump(stacks[marks[-1]:])
    return threads[0][1] if threads else []
