"""`traingate init`: the command lines a repo's READMEs document, read as text, never run.

A documented command is a line of a README that runs a Python file (`python train.py --device=cpu`,
`$ python3 main.py`, a `\\`-continued line), in the folder the README runs it in: the README's
own folder, then any `cd` before it in the same code block (`cd examples/mnist && python
main.py`). The data preparation a README runs first (`python data/shakespeare_char/prepare.py`)
is kept with each command that follows it, as what that command needs before it trains.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from traingate.pipeline.gate.init_scan import SKIPPED_FOLDERS

README_NAMES = re.compile(r"^readme(\.(md|markdown|rst|txt))?$", re.IGNORECASE)
MAX_READMES = 50
MAX_README_BYTES = 500_000
PYTHONS = re.compile(r"^python(3(\.\d+)?)?$")
# A script that prepares what training reads, by its name or its folder's.
PREPARES = re.compile(r"prepare|prep|download|preprocess|fetch|get_data|make_data|build_data|gen_data|generate_data", re.IGNORECASE)
FENCE = re.compile(r"^\s*(```|~~~)")
PROMPT = re.compile(r"^\s*(?:[$>%!]\s*)+")


@dataclass(frozen=True)
class Documented:
    """One documented command line that runs a Python file of the repo."""

    readme: str  # root-relative
    line: int
    folder: str  # where it runs, root-relative ("" for the root)
    script: str  # root-relative
    args: tuple[str, ...]
    prepare: tuple[str, ...] = field(default=())  # root-relative `path.py args...` run first

    @property
    def where(self) -> str:
        return f"{self.readme}:{self.line}"

    @property
    def command(self) -> str:
        cd = f"cd {self.folder} && " if self.folder else ""
        shown = PurePosixPath(self.script).relative_to(self.folder).as_posix() if self.folder else self.script
        return cd + shlex.join(["python", shown, *self.args])

    def mentions_cpu(self) -> bool:
        return any("cpu" in arg.lower() for arg in self.args)


def readmes(root: Path) -> list[Path]:
    """The repo's READMEs, the root's first, outside environments and builds."""
    found = []
    for path in sorted(root.rglob("*"), key=lambda p: (len(p.relative_to(root).parts), p.as_posix())):
        rel = path.relative_to(root)
        if any(part in SKIPPED_FOLDERS or part.startswith(".") for part in rel.parts[:-1]):
            continue
        if README_NAMES.match(path.name) and path.is_file():
            found.append(path)
            if len(found) >= MAX_READMES:
                break
    return found


def documented_commands(root: Path) -> list[Documented]:
    """Every documented command that runs a file of the repo, in README and line order."""
    commands: list[Documented] = []
    for readme in readmes(root):
        try:
            if readme.stat().st_size > MAX_README_BYTES:
                continue
            text = readme.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        commands += _read(root, readme.relative_to(root).as_posix(), text)
    return commands


def _read(root: Path, readme: str, text: str) -> list[Documented]:
    folder = PurePosixPath(readme).parent
    commands: list[Documented] = []
    prepared: list[str] = []  # the README's preparations so far (the nearest last)
    cd = folder
    for number, line in _logical_lines(text):
        if FENCE.match(line):
            cd = folder  # a `cd` holds within its code block
            continue
        for segment in re.split(r"&&|;", PROMPT.sub("", line.strip().strip("`"))):
            words = _words(segment)
            if words[:1] == ["cd"] and len(words) == 2:
                cd = _inside(root, cd / words[1]) or cd
                continue
            found = _python_file(root, cd, words)
            if found is None and cd != PurePosixPath("."):
                # A README in a subfolder (docs/) that gives the command as run from the root.
                found, cd = _python_file(root, PurePosixPath("."), words), PurePosixPath(".")
            if found is None:
                continue
            script, args = found
            if PREPARES.search(PurePosixPath(script).stem) or PREPARES.search(PurePosixPath(script).parent.name):
                prepared.append(shlex.join([script, *args]))
                continue
            where = "" if cd == PurePosixPath(".") else cd.as_posix()
            commands.append(Documented(readme, number, where, script, tuple(args), tuple(prepared[-1:])))
    return commands


def _logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, text) with `\\`-continued lines joined."""
    joined: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for number, raw in enumerate(text.splitlines(), start=1):
        start, body = pending if pending is not None else (number, "")
        body += raw.rstrip()
        if body.endswith("\\"):
            pending = (start, body[:-1] + " ")
            continue
        pending = None
        joined.append((start, body))
    return joined


def _words(segment: str) -> list[str]:
    try:
        words = shlex.split(segment, comments=True)
    except ValueError:
        return []
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)  # `CUDA_VISIBLE_DEVICES=0 python train.py`: the environment's, not an argument
    for stop in ("|", ">", ">>", "2>&1", "&"):
        if stop in words:
            words = words[: words.index(stop)]
    return words


def _python_file(root: Path, cd: PurePosixPath, words: list[str]) -> tuple[str, list[str]] | None:
    """(root-relative script, its arguments) of `python [-u] file.py args...` run in `cd`."""
    if not words or not PYTHONS.match(words[0]):
        return None
    rest = words[1:]
    while rest and rest[0] in ("-u", "-O", "-B"):
        rest = rest[1:]
    if not rest or not rest[0].endswith(".py"):
        return None
    script = _inside(root, cd / rest[0])
    if script is None or not (root / script).is_file():
        return None
    return script.as_posix(), rest[1:]


def _inside(root: Path, path: PurePosixPath) -> PurePosixPath | None:
    """`path` normalised, where it stays under the root; else None."""
    parts: list[str] = []
    for part in path.parts:
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part.startswith("/"):
            return None
        else:
            parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")
