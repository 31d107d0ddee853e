"""Writes the token file train.py reads: a repo's data preparation, cut to a few bytes."""

from pathlib import Path

TEXT = "first citizen: before we proceed any further, hear me speak. " * 20


def prepare() -> int:
    path = Path("data") / "train.bin"  # relative: setup runs in the target root
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(TEXT.encode("ascii"))
    return path.stat().st_size  # not used by the gate: setup for a script only prepares
