"""The baseline's gate configuration and waivers, read from git at the commit its report recorded.

The version under review writes its own `[tool.traingate]`, `traingate.toml`, waiver table and
inline `# traingate: ignore[...]` comments; the baseline's are the one copy it cannot edit. They
are read from the git history of the user's checkout (never from a path the change controls),
only for a commit id as the gate records it (hex, so nothing git could take as an option), with
`git cat-file --batch` and `git grep --no-textconv` (no filter or diff driver of the repository
runs), and parsed as TOML in this process: nothing of the target is imported.
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from traingate.pipeline.gate.config_file import CONFIG_FILES, ConfigError, select_section
from traingate.pipeline.gate.waivers import INLINE_MARKER, InlineWaiver, inline_categories
from traingate.pipeline.model.config import TargetConfig, WaiverConfig

_GIT_TIMEOUT_S = 30
# A commit id as the gate records it (`git rev-parse HEAD`).
_COMMIT = re.compile(r"[0-9a-f]{4,64}")


@dataclass(frozen=True)
class BaselineSettings:
    """What the baseline's tree says of how it is verified."""

    commit: str
    file: str | None  # the file its configuration came from; None: it had none (the defaults)
    config: TargetConfig  # validated, its entrypoint not checked against this version's files
    inline: Counter[tuple[str, tuple[str, ...], str]] = field(default_factory=Counter)  # (path, categories, code) of its inline waivers

    def has_waiver(self, waiver: WaiverConfig) -> bool:
        """The baseline's table has this entry (the reason's wording aside)."""
        return any(_waiver_key(waiver) == _waiver_key(known) for known in self.config.waive)


@dataclass(frozen=True)
class NotCompared:
    """Why the baseline's configuration could not be read."""

    reason: str
    commit: str | None


def read_baseline_settings(origin: Path, commit: str | None) -> BaselineSettings | NotCompared:
    if not commit:
        return NotCompared("the baseline report records no commit (it was not run in a git checkout)", None)
    if not _COMMIT.fullmatch(commit):
        return NotCompared(f"the baseline report's commit {commit[:80]!r} is not a commit id", None)
    try:
        if _git(origin, "cat-file", "-e", f"{commit}^{{commit}}") is None:
            return NotCompared(f"commit {commit} is not in this clone; fetch with enough depth (actions/checkout `fetch-depth: 0`)", commit)
        prefix = (_git(origin, "rev-parse", "--show-prefix") or b"").decode().strip()
        texts = _read_files(origin, commit, [prefix + name for name in CONFIG_FILES])
        source, raw, _ = select_section(dict(zip(CONFIG_FILES, texts, strict=True)))
        config = TargetConfig.model_validate(raw)
        inline = _inline_waivers(origin, commit)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError, UnicodeDecodeError) as exc:
        return NotCompared(f"the configuration of commit {commit} could not be read: {_first(exc)}", commit)
    except ConfigError as exc:
        return NotCompared(f"the configuration of commit {commit} is not valid here: {exc}", commit)
    except ValidationError as exc:
        err = exc.errors()[0]
        return NotCompared(f"the configuration of commit {commit} does not validate here: {'.'.join(map(str, err['loc']))}: {err['msg']}", commit)
    return BaselineSettings(commit=commit, file=source, config=config, inline=inline)


def inline_key(root: Path, waiver: InlineWaiver) -> tuple[str, tuple[str, ...], str]:
    """How an inline waiver of this version is matched with the baseline's: its file, its
    categories and the code on its line (so a line that moved still matches, and the same
    comment put on another line does not)."""
    try:
        lines = (root / waiver.path).read_text(encoding="utf-8", errors="replace").splitlines()
        code = lines[waiver.line - 1]
    except (OSError, IndexError):
        code = ""
    return waiver.path, tuple(sorted(c.value for c in waiver.categories)), _code(code)


def _code(line: str) -> str:
    return line.split("#", 1)[0].strip()


def _waiver_key(waiver: WaiverConfig) -> tuple[Any, ...]:
    return waiver.id, waiver.category, waiver.path, waiver.line, waiver.function, waiver.expires


def _git(origin: Path, *args: str, stdin: bytes | None = None) -> bytes | None:
    done = subprocess.run(["git", "-C", str(origin), *args], input=stdin, capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)
    return done.stdout if done.returncode == 0 else None


def read_files_at(origin: Path, commit: str, paths: list[str]) -> list[str | None]:
    """Each path (relative to the target's root, which may be a folder of its repository) as
    the commit has it; None where it has no such file. Raises OSError where git cannot say."""
    if not _COMMIT.fullmatch(commit):
        raise ValueError(f"{commit[:80]!r} is not a commit id")
    prefix = (_git(origin, "rev-parse", "--show-prefix") or b"").decode().strip()
    return _read_files(origin, commit, [prefix + path for path in paths])


def _read_files(origin: Path, commit: str, paths: list[str]) -> list[str | None]:
    """Each path's text at the commit (None where it has no such file), in one `cat-file` call."""
    out = _git(origin, "cat-file", "--batch", stdin="".join(f"{commit}:{p}\n" for p in paths).encode())
    if out is None:
        raise OSError("git cat-file failed")
    texts: list[str | None] = []
    for _ in paths:
        header, _, out = out.partition(b"\n")
        if header.endswith(b" missing") or header.endswith(b" ambiguous"):
            texts.append(None)
            continue
        kind, size = header.split()[1:3]
        body, out = out[: int(size)], out[int(size) + 1 :]
        texts.append(body.decode("utf-8") if kind == b"blob" else None)
    return texts


def _inline_waivers(origin: Path, commit: str) -> Counter[tuple[str, tuple[str, ...], str]]:
    """The baseline's `# traingate: ignore[...]` lines in its Python files (under the target's folder)."""
    done = subprocess.run(
        ["git", "-C", str(origin), "grep", "-I", "-n", "-z", "--no-color", "--no-textconv", "-e", INLINE_MARKER, commit, "--", "*.py"],
        capture_output=True, timeout=_GIT_TIMEOUT_S, check=False,
    )
    if done.returncode not in (0, 1):  # 1: no match
        raise OSError(f"git grep failed: {done.stderr.decode(errors='replace').strip()[:300]}")
    found: Counter[tuple[str, tuple[str, ...], str]] = Counter()
    for record in done.stdout.decode("utf-8", "replace").splitlines():
        name, _, rest = record.partition("\0")
        _, _, text = rest.partition("\0")
        path = name.removeprefix(f"{commit}:")
        match = inline_categories(text)
        if match is not None:
            found[(path, match, _code(text))] += 1
    return found


def _first(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:300]
