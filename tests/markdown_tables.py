"""What breaks a markdown table or title in a pull request: a control character (an ANSI escape
sequence starts with one), a raw line break inside a row, a row with more or fewer cells than
its header (an unescaped `|` in a cell)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

SEPARATOR = re.compile(r"^\|(\s*:?-+:?\s*\|)+\s*$")
UNESCAPED_PIPE = re.compile(r"(?<!\\)\|")


def _dirty(text: str) -> bool:
    return any(unicodedata.category(c) == "Cc" or c in "\u2028\u2029" for c in text)


def _cells(row: str) -> int:
    return len(UNESCAPED_PIPE.findall(row)) - 1


def table_problems(markdown: str) -> list[str]:
    """Each broken table row or title in `markdown` (fenced code blocks are not tables)."""
    problems: list[str] = []
    lines = markdown.split("\n")
    fenced = False
    index = 0
    while index < len(lines):
        line = lines[index]
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#") and _dirty(line):
            problems.append(f"title with a control character: {line!r}")
        elif not fenced and line.startswith("|") and index + 1 < len(lines) and SEPARATOR.match(lines[index + 1]):
            width = _cells(line)
            index += 2
            while index < len(lines) and lines[index].strip():
                row = lines[index]
                if _dirty(row) or not row.startswith("|") or not row.endswith("|") or _cells(row) != width:
                    problems.append(f"broken row under {line!r}: {row!r}")
                index += 1
            continue
        index += 1
    return problems


def report_folder_problems(out: Path) -> list[str]:
    """Every markdown file a gate run wrote into `out`, checked."""
    return [f"{path.name}: {problem}" for path in sorted(out.glob("*.md")) for problem in table_problems(path.read_text(encoding="utf-8"))]
