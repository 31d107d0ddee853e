"""This version's tree with other files laid over it, in a neutral temporary folder: the
baseline's test files over this version's code (docs/edited-tests.md), where the execution
stage replays the baseline's tests and the stages that observe training run a test in its
baseline form."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path, PurePosixPath

# Never linked into the view: version control and caches.
_NOT_LINKED = frozenset({".git", "__pycache__", ".pytest_cache"})


def build_view(current: Path, overlay: dict[str, str | None]) -> Path:
    """A neutral temporary folder that is this version's tree with the overlay laid over it:
    the folders that hold an overlaid file are real, every other entry links to this version's."""
    into = Path(tempfile.mkdtemp())
    real = {PurePosixPath(".")} | {parent for path in overlay for parent in PurePosixPath(path).parents}
    for folder in sorted(real, key=lambda p: len(p.parts)):
        (into / folder).mkdir(parents=True, exist_ok=True)
        source = current / folder
        if not source.is_dir():
            continue
        for entry in source.iterdir():
            rel = folder / entry.name
            if rel in real or rel.as_posix() in overlay or entry.name in _NOT_LINKED:
                continue
            (into / rel).symlink_to(entry, target_is_directory=entry.is_dir())
    for path, text in overlay.items():
        if text is not None:
            (into / path).write_text(text, encoding="utf-8")
    return into


def remove_view(view: Path) -> None:
    shutil.rmtree(view, ignore_errors=True)  # links are removed, never followed
