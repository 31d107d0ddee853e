"""The baseline's tests replayed on this version (docs/edited-tests.md).

A change that breaks the code can make its own suite green by rewriting the tests it breaks.
So, with a `--baseline` whose report records its commit, every test that passed there and
whose test code this version changed (its file, the conftest files and pytest configuration
above it, the helper modules of its test folder) runs again in its baseline form: those files
as the baseline commit has them (read from the git history of the user's tree), laid over
this version's code in a neutral temporary folder, in a pytest child isolated like the suite.

This module plans the replay (`plan_replay`) and builds the folder (`build_view`); the pytest
run is `suite.run_suite` on that folder, and `replay_checks` turns its outcomes into findings.
"""

from __future__ import annotations

import configparser
import subprocess
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from traingate.pipeline.model.schema import TestRecord
from traingate.pipeline.model.tomlcompat import tomllib
from traingate.stages.execution.accounting import TEST_FILE
# The folder the baseline's tests run in (shared with the stages that observe a test's training).
from traingate.stages.agent.tree_view import build_view as build_view, remove_view as remove_view

# Folders that hold only tests: their helper modules are part of the test, not of the code.
TEST_FOLDERS = frozenset({"tests", "test", "testing"})
CONFIG_NAMES = ("pytest.toml", ".pytest.toml", "pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
_GIT_TIMEOUT_S = 30


@dataclass(frozen=True)
class ReplayPlan:
    """The baseline test files to run, the tests of theirs that passed there, and the files
    (path -> the baseline's text, None where the baseline had none) laid over this version."""

    commit: str
    files: list[str]
    tests: list[TestRecord]
    overlay: dict[str, str | None]
    changed: dict[str, list[str]] = field(default_factory=dict)  # test file -> what differs in its context


@dataclass(frozen=True)
class NotReplayed:
    """Why the changed tests could not be replayed (no commit recorded, not in this clone)."""

    reason: str
    commit: str | None


class GitTree:
    """The files of one commit, read with git from the user's tree (a sub-folder of a repository too)."""

    def __init__(self, origin: Path, commit: str) -> None:
        self.origin, self.commit = origin, commit
        self.prefix = self._git("rev-parse", "--show-prefix").decode().strip()
        listing = self._git("ls-tree", "-r", "-z", "--full-name", "--name-only", commit, "--", ".")
        self.paths = frozenset(p[len(self.prefix):] for p in listing.decode("utf-8", "surrogateescape").split("\0") if p)
        self._cache: dict[str, str | None] = {}

    def _git(self, *args: str, stdin: bytes | None = None) -> bytes:
        done = subprocess.run(["git", "-C", str(self.origin), *args], input=stdin, capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)
        if done.returncode != 0:
            raise OSError(f"git {args[0]} failed: {done.stderr.decode(errors='replace').strip()[:300]}")
        return done.stdout

    def read(self, paths: list[str]) -> dict[str, str | None]:
        """Each path's text at the commit (None where the commit has no such file), in one git call."""
        wanted = [p for p in dict.fromkeys(paths) if p not in self._cache]
        present = [p for p in wanted if p in self.paths]
        for p in wanted:
            self._cache[p] = None
        if present:
            out = self._git("cat-file", "--batch", stdin="".join(f"{self.commit}:{self.prefix}{p}\n" for p in present).encode())
            for path in present:
                header, _, out = out.partition(b"\n")
                size = int(header.split()[2])
                self._cache[path], out = out[:size].decode("utf-8", "replace"), out[size + 1:]
        return {p: self._cache[p] for p in paths}


def open_tree(origin: Path | None, commit: str | None) -> GitTree | NotReplayed:
    if not commit:
        return NotReplayed("the baseline report records no commit (it was not run in a git checkout)", None)
    if origin is None:
        return NotReplayed("the gate was not given the target's checkout", commit)
    check = subprocess.run(["git", "-C", str(origin), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)
    if check.returncode != 0:
        return NotReplayed(f"commit {commit} is not in this clone; fetch with enough depth (actions/checkout `fetch-depth: 0`)", commit)
    try:
        return GitTree(origin, commit)
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as exc:
        return NotReplayed(f"the files of commit {commit} could not be read: {exc}", commit)


def plan_replay(root: Path, tree: GitTree, base: list[TestRecord]) -> ReplayPlan:
    """The baseline-passed tests whose test code differs here, by test file."""
    passed: dict[str, list[TestRecord]] = {}
    for record in base:
        if record.outcome == "passed" and record.path and record.path in tree.paths:
            passed.setdefault(record.path, []).append(record)
    contexts = {path: _context(root, tree, path) for path in passed}
    baseline = tree.read(sorted({c for context in contexts.values() for c in context}))
    overlay: dict[str, str | None] = {}
    changed: dict[str, list[str]] = {}
    for path, context in contexts.items():
        differs = [c for c in context if _differs(c, baseline[c], _current(root / c))]
        if differs:
            changed[path] = differs
            overlay.update({c: baseline[c] for c in context})
    files = sorted(changed)
    return ReplayPlan(commit=tree.commit, files=files, tests=[t for f in files for t in passed[f]], overlay=overlay, changed=changed)


def _context(root: Path, tree: GitTree, test_file: str) -> list[str]:
    """The files that make a test file's tests what they are, in either version."""
    parents = list(PurePosixPath(test_file).parents)  # its folder, ..., "."
    found = [test_file]
    for folder in parents:
        found += [_join(folder, "conftest.py")] + [_join(folder, name) for name in CONFIG_NAMES]
    tops = [f for f in reversed(parents) if f.name in TEST_FOLDERS]
    if tops:  # its folder's helper modules (the other test files are tests of their own)
        top = tops[0].as_posix()
        found += [p for p in tree.paths if p.startswith(top + "/") and _helper(p)]
        found += [p.relative_to(root).as_posix() for p in (root / top).rglob("*.py") if "__pycache__" not in p.parts and _helper(p.name)]
    return list(dict.fromkeys(found))


def _helper(path: str) -> bool:
    return path.endswith(".py") and not TEST_FILE.match(PurePosixPath(path).name)


def _join(folder: PurePosixPath, name: str) -> str:
    return (folder / name).as_posix() if folder.as_posix() != "." else name


def _current(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
    except OSError:
        return None


def _differs(path: str, baseline: str | None, current: str | None) -> bool:
    """Whether the two versions of a file differ for pytest (of a shared configuration file,
    only its pytest section counts)."""
    name = PurePosixPath(path).name
    if name in ("pyproject.toml", "setup.cfg", "tox.ini"):
        return _pytest_section(name, baseline) != _pytest_section(name, current)
    return baseline != current


def _pytest_section(name: str, text: str | None) -> object:
    if text is None:
        return None
    try:
        if name == "pyproject.toml":
            tool = tomllib.loads(text).get("tool", {})
            return tool.get("pytest") if isinstance(tool, dict) else None
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(text)
        section = "pytest" if name == "tox.ini" else "tool:pytest"
        return dict(parser[section]) if parser.has_section(section) else None
    except (tomllib.TOMLDecodeError, configparser.Error):
        return text  # unreadable: compared as text
