"""Two runs' returned values compared as training results: timings left out.

What an entrypoint returns is compared between runs of the same configuration and seed (the
concurrency stage's same-seed reruns; the unwatched run against the watched ones, in the gate).
Keys, fields and table columns named like durations, timestamps, throughput or memory
legitimately differ between identical runs and are left out; the rest must match exactly.
"""

from __future__ import annotations

import math
import re
from typing import Any

# Returned values that legitimately differ between two identical runs.
VOLATILE_KEY = re.compile(r"(time|duration|elapsed|latency|wall|clock|sec|_s$|_ms$|_us$|speed|throughput|per_s|fps|rate|util|mem|rss|bytes|date|stamp|pid|path|dir|host|uuid)", re.I)


def same_value(a: Any, b: Any) -> bool:
    """Exact equality; NaN equals NaN (two runs that both produce NaN agree)."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if (isinstance(a, list) and isinstance(b, list)) or (isinstance(a, tuple) and isinstance(b, tuple)):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b and type(a) is type(b)


_FIELD = re.compile(r"\b(?P<name>[A-Za-z_]\w*)=(?P<value>'[^']*'|\"[^\"]*\"|[^,()\[\]{}]*)")


def without_volatile_text(text: str) -> tuple[str, list[str]]:
    """The text of a returned object (a dataclass's repr, a printed table) with time-like
    fields and columns left out, and their names: `EpochStats(loss=0.5, epoch_duration=1.2)`
    loses `epoch_duration=…`; a table whose header names `epoch_duration` loses that column."""
    ignored: list[str] = []

    def field_value(match: re.Match[str]) -> str:
        if VOLATILE_KEY.search(match.group("name")):
            ignored.append(match.group("name"))
            return f"{match.group('name')}=…"
        return match.group(0)

    text = _FIELD.sub(field_value, text)
    lines = text.splitlines()
    if len(lines) >= 2:
        header = lines[0].split()
        drop = [i for i, name in enumerate(header) if VOLATILE_KEY.search(name)]
        body = [line.split() for line in lines[1:] if line.strip()]
        # A table as pandas prints it: each row is its index, then one value per header column.
        if drop and body and all(len(row) == len(header) + 1 for row in body):
            ignored += [header[i] for i in drop]
            keep = [i for i in range(len(header)) if i not in drop]
            lines = [" ".join(header[i] for i in keep)] + [" ".join([row[0], *(row[i + 1] for i in keep)]) for row in body]
            text = "\n".join(lines)
    return text, ignored


def comparable_leaves(value: Any, prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """Leaves of a returned value by key path; keys that hold timings or memory left out, and
    time-like fields or columns of an object's text (see `without_volatile_text`)."""
    kept: dict[str, Any] = {}
    ignored: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if VOLATILE_KEY.search(str(key)):
                ignored.append(path)
                continue
            sub_kept, sub_ignored = comparable_leaves(item, path)
            kept.update(sub_kept)
            ignored += sub_ignored
    elif isinstance(value, list) and value and all(isinstance(v, (dict, list)) for v in value):
        for index, item in enumerate(value):
            sub_kept, sub_ignored = comparable_leaves(item, f"{prefix}[{index}]")
            kept.update(sub_kept)
            ignored += sub_ignored
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        texts = [without_volatile_text(v) for v in value]  # e.g. a list of dataclasses, each summarised as its repr
        kept[prefix or "(value)"] = [text for text, _ in texts]
        ignored += [f"{prefix}[].{name}" if prefix else f"[].{name}" for name in dict.fromkeys(n for _, names in texts for n in names)]
    elif isinstance(value, str) and ("=" in value or "\n" in value):
        text, dropped = without_volatile_text(value)
        kept[prefix or "(value)"] = text
        ignored += [f"{prefix}.{name}" if prefix else name for name in dict.fromkeys(dropped)]
    else:
        kept[prefix or "(value)"] = value
    return kept, ignored
