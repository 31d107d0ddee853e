"""Which of the tracked files a stage's run rewrote matter to the gate, and which are results.

A run that changes what the gate executes or reads (Python sources and binaries, tests and
their data, conftest, the configuration pytest, traingate and packaging read, configuration
files the training may read: .toml, .ini, .cfg, .yaml; a file the entrypoint is given) changed
what is checked: `target-modified`, always blocking. A training
function that writes its results over tracked files (a reproducibility snapshot `.json`, a
`.md` table, a `.txt` log) changed nothing the gate runs: one low `target-modified/result-files`
finding per run, whichever stage saw it first, and never blocking.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from traingate.pipeline.config import TargetConfig
from traingate.pipeline.findings import finding
from traingate.pipeline.schema import Category, Evidence, EvidenceKind, Finding

# Executed by Python or loaded by it: sources, stubs, path hooks, extension modules, bytecode.
CODE_SUFFIXES = frozenset({".py", ".pyi", ".pyw", ".pyx", ".pxd", ".pth", ".so", ".pyd", ".dylib", ".dll", ".pyc"})
# Read by pytest, traingate, coverage or the packaging tools the target's code is installed with.
CONFIG_NAMES = frozenset(
    {
        "pyproject.toml", "traingate.toml", "pytest.ini", ".pytest.ini", "setup.cfg", "tox.ini", ".coveragerc",
        "MANIFEST.in", "Pipfile", "Pipfile.lock", "poetry.lock", "uv.lock", "pdm.lock", "environment.yml", "environment.yaml",
    }
)
# Configuration formats: the training may read its settings from any of them.
CONFIG_SUFFIXES = frozenset({".toml", ".ini", ".cfg", ".conf", ".yaml", ".yml"})
_REQUIREMENTS = re.compile(r"^(requirements|constraints)[\w.-]*\.(txt|in)$", re.IGNORECASE)
# Tests read their data files: everything under a test folder is an input.
TEST_FOLDERS = frozenset({"tests", "test", "testing"})
RESULT_FILES_RULE = "target-modified/result-files"


def named_paths(config: TargetConfig) -> set[str]:
    """Paths the gate hands the target (the test paths, the entrypoint's script, args and
    string kwargs), relative and normalised: a file named there is an input, whatever it is."""
    texts: list[Any] = [p for p in (config.tests or []) if not str(p).startswith("-")]
    ep = config.entrypoint
    if ep is not None:
        texts += [ep.script, *ep.args, *ep.kwargs.values()]
    found = set()
    for text in texts:
        if isinstance(text, str) and text and not text.startswith("-") and "\n" not in text:
            found.add(posixpath.normpath(text))
    return found


def is_gate_input(rel: str, named: Iterable[str] = ()) -> bool:
    """True when the gate executes or reads `rel` (a path relative to the target's root)."""
    path = PurePosixPath(rel)
    if path.suffix.lower() in CODE_SUFFIXES | CONFIG_SUFFIXES or path.name in CONFIG_NAMES or _REQUIREMENTS.match(path.name):
        return True
    if TEST_FOLDERS & set(path.parts[:-1]):
        return True
    return any(rel == n or rel.startswith(n.rstrip("/") + "/") for n in named if n != ".")


@dataclass
class ResultWrites:
    """Tracked files the run's training rewrote, reported once per run."""

    reported: set[str] = field(default_factory=set)

    def finding(self, stage: str, modified: list[str], deleted: list[str]) -> Finding | None:
        """The low finding for the files not reported by an earlier stage; None when there are none."""
        modified = [p for p in modified if p not in self.reported]
        deleted = [p for p in deleted if p not in self.reported]
        if not modified and not deleted:
            return None
        self.reported.update(modified, deleted)
        return result_files_finding(stage, modified, deleted)


def result_files_finding(stage: str, modified: list[str], deleted: list[str]) -> Finding:
    named = [*modified, *(f"{p} (deleted)" for p in deleted)]
    listed = ", ".join(named[:10]) + (f" and {len(named) - 10} more" if len(named) > 10 else "")
    return finding(
        stage=stage,
        category=Category.TARGET_MODIFIED,
        rule=RESULT_FILES_RULE,
        title=f"Training writes into tracked files: {listed}",
        location=None,
        problem=(
            f"While the {stage} stage ran the target's code, it rewrote {len(named)} tracked file(s) that the gate neither runs "
            f"nor reads: {listed}. It is reported once per run, by the first stage that saw it; the gate ran on a copy, so your files are unchanged."
        ),
        evidence=Evidence(
            kind=EvidenceKind.OBSERVED,
            summary=f"{len(modified)} modified, {len(deleted)} deleted, none of them code, tests or configuration",
            data={"modified": modified, "deleted": deleted},
        ),
        block_on=set(),  # the rule never blocks
        key="result-files",
    )
