"""Text taken from the target (exception messages, output, reprs) made fit for a report.

Both sides may use it: the gate strips terminal escape codes from every finding's text, and
the stages cut long messages here, at line boundaries, saying how much was left out.
"""

from __future__ import annotations

import re

# CSI sequences (colours, cursor moves), OSC sequences (titles, hyperlinks) and lone escapes.
_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """`text` without terminal escape codes (`\\x1b[1m` and the like)."""
    return _ANSI.sub("", text) if "\x1b" in text else text


def clip_line(line: str, limit: int) -> str:
    """One line of at most about `limit` characters, cut at a word boundary, never mid-word."""
    if len(line) <= limit:
        return line
    head = line[:limit]
    space = head.rfind(" ")
    if space > limit // 2:
        head = head[:space]
    return head.rstrip() + " …"


def clip_text(text: str, limit: int, *, max_lines: int | None = None) -> str:
    """`text` cleaned of escape codes and cut to whole lines within `limit` characters (and
    `max_lines` lines), followed by how many lines were left out; a first line longer than
    the limit on its own is cut at a word boundary."""
    lines = strip_ansi(text).strip("\n").splitlines()
    kept: list[str] = []
    used = 0
    for line in lines:
        if (max_lines is not None and len(kept) >= max_lines) or (kept and used + len(line) + 1 > limit):
            break
        kept.append(clip_line(line, limit) if not kept else line)
        used += len(kept[-1]) + 1
    left = len(lines) - len(kept)
    if left:
        kept.append(f"[… {left} more line{'s' if left != 1 else ''} left out]")
    return "\n".join(kept)


def first_line(text: str, limit: int = 300) -> str:
    """The first non-blank line, without escape codes, cut at a word boundary."""
    for line in strip_ansi(text).splitlines():
        if line.strip():
            return clip_line(line.strip(), limit)
    return ""
