"""`--baseline REVISION`: a pull request judged against its base, with nothing added to the CI.

`--baseline` takes a report.json (as before) or a git revision of the target repo (a branch,
a tag, a sha). A revision is resolved to a commit id, then:

- a report of that commit and task kept in the reports folder (`--reports`, default
  `traingate-reports/baselines`) is used when it names that commit, was made by this
  traingate version under the same CI policy file, and is read now, before any code of the
  change runs (the folder is in the workspace: what the change's code writes there later is
  never read by this run);
- otherwise the commit is verified first: a clean tree of it, made from git's objects (a
  `--shared` clone checked out at the commit, never the change's working tree), run through
  `traingate run` in a process of its own with the configuration that commit holds and the
  same stages, device and CI policy; its report is kept there for the next run.

A base that blocks still serves as the floor for what it verified. A revision that does not
resolve (no such commit, a shallow clone without it) is not a run without a baseline: the
caller reports it as a blocking `baseline-unavailable` finding that says how to fix the checkout.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ValidationError

from traingate import __version__
from traingate.pipeline.model.schema import PipelineReport

DEFAULT_REPORTS = Path("traingate-reports") / "baselines"
KEPT = "kept.json"  # beside each kept report.json: what it was made for
GIT_TIMEOUT_S = 60


@dataclass(frozen=True)
class BaseResolution:
    """The baseline a revision gave: the report (None: it could not be had, `problem` says
    why) and how it was had, for the report to say."""

    revision: str
    commit: str | None
    report: dict[str, object] | None
    source: Literal["kept", "verified"] | None  # None: it could not be had
    path: str  # the report.json used
    note: str  # how it was had, in a sentence
    problem: str | None = None


def is_report_path(value: str) -> bool:
    """A `--baseline` value that names a file, or looks like one (a `.json` name; a path to a
    folder, refused as unreadable), is a report; anything else a revision (`main`, `tests`: a
    branch may share its name with a folder of the checkout)."""
    path = Path(value)
    return path.is_file() or path.suffix == ".json" or (path.is_dir() and (path.is_absolute() or value.startswith(".")))


def resolve(root: Path, revision: str, task: str, store: Path, policy_file: Path | None, rerun: list[str], say: Callable[[str], None] | None = None) -> BaseResolution:
    """The baseline `revision` names (see the module's docstring); `rerun`: the options the
    base's own run takes (stages, device); `say`: told before a base is verified (minutes)."""
    commit = _commit(root, revision)
    if commit is None:
        return BaseResolution(
            revision, None, None, None, "", "",
            problem=(
                f"`--baseline {revision}` names no commit in this checkout: it is not a branch, tag or sha git knows here "
                "(a shallow clone holds only the change's commit)"
            ),
        )
    folder = store / task / commit
    fingerprint = _policy_fingerprint(policy_file)
    report, why_not = _kept(folder, commit, task, fingerprint)
    if report is not None:
        return BaseResolution(revision, commit, report, "kept", str(folder / "report.json"), f"the report of {commit[:12]} kept in {folder} by an earlier run" + _blocked(report))
    if say is not None:
        say(f"verifying the base {revision} ({commit[:12]}) first" + (f": {why_not}" if why_not else ": no report of it is kept"))
    problem = _verify(root, commit, task, folder, policy_file, rerun)
    if problem is not None:
        return BaseResolution(revision, commit, None, "verified", str(folder / "report.json"), "", problem=problem)
    report, still = _kept(folder, commit, task, fingerprint)
    if report is None:
        return BaseResolution(revision, commit, None, "verified", str(folder / "report.json"), "", problem=f"the base's run left no report to use ({still})")
    note = f"{commit[:12]} verified in this run" + (f" (no kept report was used: {why_not})" if why_not else "") + _blocked(report)
    return BaseResolution(revision, commit, report, "verified", str(folder / "report.json"), note)


def _blocked(report: dict[str, object]) -> str:
    """What the note adds for a base that blocks: it is still the floor for what it verified."""
    return "; the base itself BLOCKs: it is the floor for what it verified" if report.get("decision") == "BLOCK" else ""


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=False)


def _commit(root: Path, revision: str) -> str | None:
    if revision.startswith("-"):
        return None  # never an option to git
    try:
        done = _git(root, "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    except (OSError, subprocess.TimeoutExpired):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and len(commit) >= 40 else None


def _policy_fingerprint(policy_file: Path | None) -> str:
    if policy_file is None:
        return "none"
    try:
        return hashlib.sha256(policy_file.read_bytes()).hexdigest()
    except OSError:
        return "unreadable"


def _kept(folder: Path, commit: str, task: str, fingerprint: str) -> tuple[dict[str, object] | None, str | None]:
    """The kept report of `commit`, or None and why it cannot be used (None: there is none)."""
    report_file, kept_file = folder / "report.json", folder / KEPT
    if not report_file.is_file():
        return None, None
    try:
        kept = json.loads(kept_file.read_text(encoding="utf-8"))
        data = json.loads(report_file.read_text(encoding="utf-8"))
        report = PipelineReport.model_validate(data)
    except (OSError, ValueError, ValidationError) as exc:
        return None, f"the kept report at {folder} cannot be read ({type(exc).__name__})"
    expected = {"commit": commit, "task": task, "tool_version": __version__, "policy": fingerprint}
    wrong = [key for key, value in expected.items() if kept.get(key) != value]
    if report.target.commit != commit:
        wrong.append("the report's own commit")
    if wrong:
        return None, f"the kept report at {folder} was made for another {', '.join(wrong)}"
    return dict(data), None


def _verify(root: Path, commit: str, task: str, folder: Path, policy_file: Path | None, rerun: list[str]) -> str | None:
    """Run the gate on a clean tree of `commit`; keep its report in `folder`. None when a
    report came out, else why not."""
    work = Path(tempfile.mkdtemp(prefix="traingate-base-"))
    tree = work / "tree"
    try:
        # The repository's root is cloned; a target in a folder of it is that folder of the tree.
        top = _git(root, "rev-parse", "--show-toplevel").stdout.strip() or str(root)
        prefix = _git(root, "rev-parse", "--show-prefix").stdout.strip()
        for args in (["clone", "--quiet", "--shared", "--no-checkout", top, str(tree)], ["-C", str(tree), "checkout", "--quiet", "--detach", commit]):
            done = subprocess.run(["git", *args], capture_output=True, text=True, timeout=GIT_TIMEOUT_S * 5, check=False)
            if done.returncode != 0:
                return f"git could not make a tree of {commit[:12]}: {done.stderr.strip()[-300:]}"
        target = tree / prefix if prefix else tree
        if not target.is_dir():
            return f"commit {commit[:12]} has no folder {prefix.rstrip('/')}: the target did not exist there"
        if folder.exists():
            shutil.rmtree(folder)
        folder.parent.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "traingate", "run", str(target), "--task", task, "--version", f"base-{commit[:12]}", "--out", str(folder), "--quiet", *rerun]
        if policy_file is not None:
            argv += ["--policy", str(policy_file)]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if not (folder / "report.json").is_file():
            return f"the base's run (exit status {done.returncode}) wrote no report: {done.stderr.strip()[-500:]}"
        (folder / KEPT).write_text(json.dumps({"commit": commit, "task": task, "tool_version": __version__, "policy": _policy_fingerprint(policy_file)}), encoding="utf-8")
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def keep(root: Path, report_file: Path, store: Path, policy_file: Path | None) -> str:
    """`run --keep`: this run's report kept as its commit's, for the pull requests based on it
    (a push to the default branch). Kept only when the checkout is that commit exactly: a tree
    with uncommitted changes is not the commit the report would be read as. What happened, in a
    sentence."""
    try:
        data = json.loads(report_file.read_text(encoding="utf-8"))
        report = PipelineReport.model_validate(data)
    except (OSError, ValueError, ValidationError) as exc:
        return f"not kept: the report cannot be read ({type(exc).__name__})"
    commit = report.target.commit
    head = _commit(root, "HEAD")
    if commit is None or head != commit:
        return "not kept: the report names no commit, or not the checkout's"
    try:
        dirty = _git(root, "status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "not kept: git could not say whether the checkout is clean"
    if dirty:
        return "not kept: the checkout has uncommitted changes"
    folder = store / report.task / commit
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(data), encoding="utf-8")
    (folder / KEPT).write_text(json.dumps({"commit": commit, "task": report.task, "tool_version": __version__, "policy": _policy_fingerprint(policy_file)}), encoding="utf-8")
    return f"kept as the baseline report of {commit[:12]} in {folder}"
