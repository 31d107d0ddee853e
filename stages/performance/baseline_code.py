"""The baseline's own code, to time beside this version's (stages/performance/side_by_side.py).

The baseline report records the commit it ran at; where the user's clone has that commit, its
tree is written with `git archive` into a temporary folder the stage owns (outside the target's
copy, named like the target), and its entrypoint is read from that tree's own configuration
(`traingate.toml`, else `[tool.traingate]` of `pyproject.toml`), so the baseline runs as it was
configured, whatever this version's configuration says. Only a hexadecimal commit id reaches
git: a baseline report cannot hand it an option.
"""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from traingate.pipeline.model.config import EntrypointConfig
from traingate.pipeline.model.tomlcompat import tomllib

_COMMIT = re.compile(r"[0-9a-f]{4,64}")
_GIT_TIMEOUT_S = 60
# A tree larger than this is not written out: timing it would cost more than it tells.
MAX_TREE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class BaselineCode:
    commit: str
    root: Path  # the baseline's tree, written out
    entrypoint: EntrypointConfig

    def remove(self) -> None:
        shutil.rmtree(self.root.parent, ignore_errors=True)


def checkout(origin: Path | None, commit: str | None, name: str) -> BaselineCode | str:
    """The baseline's tree and entrypoint, or why there is none (one sentence)."""
    if not commit:
        return "the baseline report records no commit (it was not run in a git checkout)"
    if not _COMMIT.fullmatch(commit):
        return "the baseline report's commit is not a commit id"
    if origin is None:
        return "the gate was not given the target's checkout"
    try:
        if _git(origin, "cat-file", "-t", commit).strip() != b"commit":
            return f"commit {commit} is not in this clone; fetch with enough depth (actions/checkout `fetch-depth: 0`)"
        prefix = _git(origin, "rev-parse", "--show-prefix").decode().strip()
        top = Path(_git(origin, "rev-parse", "--show-toplevel").decode().strip())
        # From the top level: run in a sub-folder, `git archive` would look for it inside the tree again.
        archive = _git(top, "archive", "--format=tar", f"{commit}:{prefix}" if prefix else commit)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"commit {commit} is not in this clone or could not be read ({str(exc)[:200]})"
    if len(archive) > MAX_TREE_BYTES:
        return f"the baseline's tree is {len(archive) / 2**20:.0f} MiB, over the {MAX_TREE_BYTES // 2**20} MiB written out for timing"
    if not hasattr(tarfile, "data_filter"):
        return "this Python's tarfile cannot write a tree out safely (no extraction filters before 3.10.12)"
    root = Path(tempfile.mkdtemp()) / name
    try:
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            # The "data" filter refuses links and paths that leave the folder.
            tar.extractall(root, filter="data")
    except (tarfile.TarError, OSError) as exc:
        shutil.rmtree(root.parent, ignore_errors=True)
        return f"the baseline's tree could not be written out: {str(exc)[:200]}"
    entrypoint = entrypoint_of(root)
    if isinstance(entrypoint, str):
        shutil.rmtree(root.parent, ignore_errors=True)
        return entrypoint
    return BaselineCode(commit, root, entrypoint)


def entrypoint_of(root: Path) -> EntrypointConfig | str:
    """The entrypoint the tree at `root` configures, or why it has none usable."""
    for name, table in (("traingate.toml", ()), ("pyproject.toml", ("tool", "traingate"))):
        path = root / name
        if not path.is_file():
            continue
        try:
            raw: object = tomllib.loads(path.read_text(encoding="utf-8", errors="replace"))
        except (tomllib.TOMLDecodeError, OSError):
            return f"the baseline's {name} cannot be read"
        for key in table:
            raw = raw.get(key) if isinstance(raw, dict) else None
        if raw is None:
            continue
        section = raw.get("entrypoint") if isinstance(raw, dict) else None
        if section is None:
            return f"the baseline's {name} configures no entrypoint"
        try:
            return EntrypointConfig.model_validate(section)
        except ValidationError as exc:
            return f"the baseline's entrypoint in {name} is not valid ({exc.errors()[0]['msg']})"
    return "the baseline's commit has no traingate configuration"


def _git(origin: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "-C", str(origin), *args], capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise OSError(done.stderr.decode(errors="replace").strip() or f"git {args[0]} failed")
    return done.stdout
