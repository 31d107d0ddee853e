"""Which of the tracked files a stage's run rewrote matter to the gate, and which are results.

Decided by observation, not by a file's name (docs/contract.md, "Files the run rewrote"). A
rewritten file changed what is checked, `target-modified` and always blocking, when a later run
of the stage or the gate reads it: Python sources and binaries, the configuration the gate and
pytest parse, the requirements files the gate reads, the paths the entrypoint and `tests` name, and every file the stage's runs of
target code opened for reading (recorded by an audit hook in those processes,
`traingate.stages.common.reads`). A file the run read and then rewrote (a config it edits)
blocks too. Everything else the training only wrote (a reproducibility snapshot, a pip-freeze
dump, a results table) changed nothing the gate runs: one low `target-modified/result-files`
finding per run, whichever stage saw it first, and never blocking. Where the record of what the
runs read is missing or incomplete, every rewritten file counts as read: the gate fails closed.
"""

from __future__ import annotations

import fnmatch
import posixpath
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.findings import finding
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding
from traingate.stages.common.reads import FilesRead

# Executed by Python or loaded by it: sources, stubs, path hooks, extension modules, bytecode.
CODE_SUFFIXES = frozenset({".py", ".pyi", ".pyw", ".pyx", ".pxd", ".pth", ".so", ".pyd", ".dylib", ".dll", ".pyc"})
# Parsed by traingate (its configuration) and by pytest (its configuration files, wherever it
# finds its rootdir), whether or not this run happened to open them.
CONFIG_NAMES = frozenset({"pyproject.toml", "traingate.toml", "pytest.ini", ".pytest.ini", "setup.cfg", "tox.ini"})
RESULT_FILES_RULE = "target-modified/result-files"


def read_by_the_gate(path: PurePosixPath) -> bool:
    """The requirements files the gate reads for an `environment` finding (what the target
    declares, `traingate.stages.agent.declared`): `requirements*.txt` at the root and
    `requirements/*.txt`. A `requirements.txt` elsewhere (a pip-freeze snapshot) is not."""
    if path.suffix != ".txt":
        return False
    top = len(path.parts) == 1 and fnmatch.fnmatchcase(path.name, "requirements*.txt")
    return top or (len(path.parts) == 2 and path.parts[0] == "requirements")


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


def is_gate_input(rel: str, named: Iterable[str] = (), read: Iterable[str] = ()) -> bool:
    """True when the gate or a later run executes or reads `rel` (relative to the target's root):
    code, the gate's and pytest's configuration, a path named in the configuration, or a file
    the runs were seen to open for reading."""
    path = PurePosixPath(rel)
    if path.suffix.lower() in CODE_SUFFIXES or path.name in CONFIG_NAMES or read_by_the_gate(path) or rel in read:
        return True
    return any(rel == n or rel.startswith(n.rstrip("/") + "/") for n in named if n != ".")


@dataclass(frozen=True)
class GateInputs:
    """What decides, for one stage, whether a rewritten file is an input (see the module)."""

    named: frozenset[str]
    read: FilesRead | None  # None: the stage handed back no record

    @classmethod
    def of(cls, config: TargetConfig, read: FilesRead | None) -> GateInputs:
        return cls(named=frozenset(named_paths(config)), read=read)

    @property
    def unknown_reads(self) -> str | None:
        """Why what the runs read is not fully known (every rewritten file then counts as read)."""
        if self.read is None:
            return "the stage handed back no record of what its runs read"
        return None if self.read.complete else (self.read.why_incomplete or "the record of what the runs read is incomplete")

    def __call__(self, rel: str) -> bool:
        if self.unknown_reads is not None:
            return True
        assert self.read is not None
        return is_gate_input(rel, self.named, frozenset(self.read.paths))

    def read_by_the_run(self, paths: Iterable[str]) -> list[str]:
        """Those of `paths` the runs were seen to open for reading."""
        seen = frozenset(self.read.paths) if self.read is not None else frozenset()
        return [p for p in paths if p in seen]


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
            summary=f"{len(modified)} modified, {len(deleted)} deleted, none of them code, configuration or read by a run",
            data={"modified": modified, "deleted": deleted},
        ),
        block_on=set(),  # the rule never blocks
        key="result-files",
    )
