"""The stages run on copies of the target, so the target cannot change what is checked.

At the start of a run the target's tree is copied once into a private folder (the pristine
copy) and its source files are hashed: in a git repo the tracked files and the untracked
ones git does not ignore, else every file copied. Each stage then gets a fresh copy of the
pristine one as its root; after the stage the gate hashes that copy again, and any source
file changed or deleted there is reported (`traingate.pipeline.gate.written_files` tells the files
the gate or a later run reads, which block, from results the training only wrote, which do not). The user's own tree is only read, never run from,
so the target's edits never reach it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from traingate.pipeline.model.findings import finding
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, StageOutcome

# Never copied: version control, caches, environments, the gate's own default output.
SKIPPED_NAMES = frozenset({".git", "__pycache__", ".venv", "venv", "node_modules", "traingate-reports"})
# Above this a copy per stage costs noticeable time and disk: say so.
LARGE_COPY_BYTES = 500 * 2**20


class SnapshotError(Exception):
    """The target's tree cannot be copied (an unreadable file, a full disk); one line."""


@dataclass(frozen=True)
class Changes:
    """Source files that differ in a stage's copy from the pristine copy."""

    modified: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.modified or self.deleted)

    def partition(self, is_input: Callable[[str], bool]) -> tuple[Changes, Changes]:
        """(the changes to files the gate runs or reads, the changes to the others)."""
        return (
            Changes(modified=[p for p in self.modified if is_input(p)], deleted=[p for p in self.deleted if is_input(p)]),
            Changes(modified=[p for p in self.modified if not is_input(p)], deleted=[p for p in self.deleted if not is_input(p)]),
        )


class Snapshot:
    """A pristine copy of the target, the hashes of its source files, and one copy per stage."""

    def __init__(self, root: Path, exclude: Path | None = None) -> None:
        self.root = root
        self.exclude = exclude.resolve() if exclude is not None else None
        self.base = Path(tempfile.mkdtemp())  # neutral: the stages' copies are the target's working folders
        self.pristine = self.base / "pristine" / root.name
        self.copied_files = 0
        self.copied_bytes = 0
        self.hashes: dict[str, str] = {}

    def __enter__(self) -> Snapshot:
        return self.take()

    def take(self) -> Snapshot:
        """Copy and hash the target once; SnapshotError when it cannot be copied."""
        if self.pristine.exists():
            return self
        try:
            shutil.copytree(self.root, self.pristine, symlinks=True, ignore=self._ignore)
            files = _files_under(self.pristine)
            self.copied_files = len(files)
            self.copied_bytes = sum((self.pristine / f).lstat().st_size for f in files)
            tracked = _git_sources(self.root)
            sources = sorted(files if tracked is None else files & tracked)
            self.hashes = {rel: _digest(self.pristine / rel) for rel in sources}
        except shutil.Error as exc:
            self.remove()
            first = exc.args[0][0] if exc.args and isinstance(exc.args[0], list) and exc.args[0] else exc
            raise SnapshotError(f"cannot copy the target: {_one_line(first)}") from None
        except OSError as exc:
            self.remove()
            raise SnapshotError(f"cannot copy the target: {_one_line(exc)}") from None
        except BaseException:
            self.remove()
            raise
        if self.copied_bytes > LARGE_COPY_BYTES:
            print(
                f"traingate: note: the target's copy is large ({self.copied_bytes / 2**20:.0f} MiB in {self.copied_files} files); "
                "every stage runs on a fresh copy of it",
                file=sys.stderr,
            )
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.remove()

    def fresh_copy(self, label: str) -> Path:
        """A new copy of the pristine tree, named like the target, for the stage `label` to run
        on, in a folder of a neutral name (not the stage's): the target's code runs in it."""
        dest = Path(tempfile.mkdtemp(dir=self.base)) / self.root.name
        shutil.copytree(self.pristine, dest, symlinks=True)
        return dest

    def discard(self, copy: Path) -> None:
        """Remove one stage's copy once its changes have been read."""
        if copy.is_relative_to(self.base) and copy != self.pristine:
            _remove_tree(copy.parent)

    def changes(self, copy: Path) -> Changes:
        """Source files modified or deleted in `copy`; new files (checkpoints, logs) are fine."""
        modified, deleted = [], []
        for rel, digest in self.hashes.items():
            path = copy / rel
            if not path.is_symlink() and not path.exists():
                deleted.append(rel)
            elif _digest(path) != digest:
                modified.append(rel)
        return Changes(modified=modified, deleted=deleted)

    def remove(self) -> None:
        _remove_tree(self.base)

    def _ignore(self, folder: str, names: list[str]) -> set[str]:
        skipped = {n for n in names if n in SKIPPED_NAMES or _is_special(Path(folder, n))}
        if self.exclude is not None:
            skipped |= {n for n in names if Path(folder, n).resolve() == self.exclude}
        return skipped


def modification_finding(stage: str, changes: Changes, read: list[str] | None = None, unknown_reads: str | None = None) -> Finding:
    """`target-modified`: the target changed its own sources while a stage ran them.

    It always blocks, whatever the policy: a version that rewrites itself while it is checked
    has not been checked. `read`: those of the files the stage's runs were seen to read;
    `unknown_reads`: why what they read is not known (every rewritten file then counts)."""
    named = [*(f"{p} (modified)" for p in changes.modified), *(f"{p} (deleted)" for p in changes.deleted)]
    listed = ", ".join(named[:10]) + (f" and {len(named) - 10} more" if len(named) > 10 else "")
    why = ""
    if read:
        why = f" The run opened {_first(read)} for reading: a later run reads what this one wrote there, not the committed file."
    if unknown_reads:
        why += f" Every rewritten file counts as an input here: {unknown_reads}."
    return finding(
        stage=stage,
        category=Category.TARGET_MODIFIED,
        title=f"The target changed its own files during the {stage} stage: {listed}",
        location=None,
        problem=(
            f"While the {stage} stage ran the target's code, {len(named)} of its source file(s) were changed or deleted: "
            f"{listed}. What the stage checked is not what was committed.{why}"
        ),
        impact="A version that edits itself while it is checked (a conftest.py that swaps in a working file, "
        "deletes a failing test) can pass a gate it should fail; the gate ran on a copy, so your files are unchanged.",
        fix="Remove the code that writes to the repository's own files (look in conftest.py, test setup and the "
        "entrypoint); write checkpoints and logs to new files or a temporary folder instead.",
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{len(changes.modified)} modified, {len(changes.deleted)} deleted",
            data={"modified": changes.modified, "deleted": changes.deleted},
        ),
        block_on=(),  # the rule always blocks
        key="target-modified " + " ".join(sorted([*changes.modified, *changes.deleted])),
    )


def _first(paths: list[str]) -> str:
    return ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")


def with_user_paths(outcome: StageOutcome, copy_root: Path, user_root: Path) -> StageOutcome:
    """The outcome with the copy's absolute path replaced by the target's, in every text
    (tracebacks, summaries, details): reports name the user's files, never a temporary folder."""
    copy_text, user_text = json.dumps(str(copy_root))[1:-1], json.dumps(str(user_root))[1:-1]
    payload = outcome.model_dump_json()
    if copy_text not in payload:
        return outcome
    return StageOutcome.model_validate_json(payload.replace(copy_text, user_text))


def _is_special(path: Path) -> bool:
    """Pipes, sockets and devices are not sources, and reading a pipe would block the copy."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return False
    return not (stat.S_ISREG(mode) or stat.S_ISDIR(mode) or stat.S_ISLNK(mode))


def _one_line(problem: object) -> str:
    if isinstance(problem, tuple) and len(problem) == 3:  # shutil.Error's (source, destination, why)
        return f"{problem[0]}: {problem[2]}"
    return " ".join(str(problem).split())


def _files_under(top: Path) -> set[str]:
    """Relative paths of every file and symlink under `top`."""
    found: set[str] = set()
    for folder, dirs, files in os.walk(top):
        here = Path(folder)
        found.update((here / n).relative_to(top).as_posix() for n in files)
        found.update((here / d).relative_to(top).as_posix() for d in dirs if (here / d).is_symlink())
    return found


def _git_sources(root: Path) -> set[str] | None:
    """Files of `root` git knows as sources, relative to it: tracked, or untracked and not
    ignored (work in progress). None when `root` is not in a git work tree."""
    try:
        done = subprocess.run(
            ["git", "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True, timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    return {n.decode("utf-8", "surrogateescape") for n in done.stdout.split(b"\0") if n}


def _digest(path: Path) -> str:
    """sha256 of a file's bytes; a symlink is hashed by where it points, never followed."""
    if path.is_symlink():
        return "link:" + os.readlink(path)
    if not path.is_file():
        return "not-a-file"
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    except OSError as exc:
        return f"unreadable:{exc.errno}"
    return h.hexdigest()


def _remove_tree(path: Path) -> None:
    """Remove a copy even where the target's code took away write permission."""

    def _retry(func, failed: str, _exc: object) -> None:  # type: ignore[no-untyped-def]
        try:
            os.chmod(os.path.dirname(failed), stat.S_IRWXU)
            os.chmod(failed, stat.S_IRWXU)
            func(failed)
        except OSError:
            pass

    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
    elif path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=_retry)
        else:
            shutil.rmtree(path, onerror=_retry)
