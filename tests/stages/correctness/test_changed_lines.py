"""Where a training-regression no nearer fact locates is put: the lines the change since the
baseline's commit touched (stages/correctness/changed_lines.py), read from a real git history."""

from __future__ import annotations

import subprocess
from pathlib import Path

from traingate.pipeline.model.schema import Location
from traingate.stages.contract.payloads.base import Site
from traingate.stages.correctness.changed_lines import changed_lines, nearest_changed, parse_diff

FALLBACK = Location(path="train.py", line=20, function="train")
TEXT = "import torch\n\nLR = 0.5\n\n\ndef train():\n    loader = make()\n    return LR\n"


def git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com", *args], check=True, capture_output=True, text=True)
    return done.stdout


def committed(tmp_path: Path) -> str:
    (tmp_path / "train.py").write_text(TEXT)
    (tmp_path / "notes.txt").write_text("a\n")
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "base")
    return git(tmp_path, "rev-parse", "HEAD").strip()


def site(line: int, path: str = "train.py") -> Site:
    return Site(path=path, line=line, function="train", code="")


def test_the_working_tree_against_the_commit_gives_the_python_lines_touched(tmp_path: Path) -> None:
    commit = committed(tmp_path)
    (tmp_path / "train.py").write_text(TEXT.replace("LR = 0.5", "LR = 0.0005").replace("    return LR\n", ""))
    (tmp_path / "notes.txt").write_text("b\n")
    assert changed_lines(tmp_path, commit) == {"train.py": {3, 8}}  # the deletion touches the line after it
    assert changed_lines(tmp_path, None) is None and changed_lines(None, commit) is None
    assert changed_lines(tmp_path, "0" * 40) is None  # not in this clone


def test_a_changed_line_the_run_executed_comes_first_else_the_first_of_the_entrypoints_file() -> None:
    changed = {"train.py": {3, 7}, "data.py": {2}}
    assert nearest_changed(changed, [site(5), site(7)], FALLBACK) == Location(path="train.py", line=7, function="train")
    assert nearest_changed(changed, [site(5)], FALLBACK) == Location(path="train.py", line=3)
    assert nearest_changed({"data.py": {2}}, [site(5)], FALLBACK) is None


def test_parse_diff_reads_hunks_of_several_files() -> None:
    text = "+++ b/a.py\n@@ -1,2 +1,3 @@\n+x\n+++ b/sub/b.py\n@@ -4 +4 @@\n+y\n+++ /dev/null\n@@ -1,3 +0,0 @@\n"
    assert parse_diff(text) == {"a.py": {1, 2, 3}, "sub/b.py": {4}}


def test_a_commit_that_is_not_an_id_is_never_handed_to_git(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from traingate.stages.correctness.changed_lines import changed_lines

    import subprocess

    for args in (["init", "-q"], ["-c", "user.email=a@b", "-c", "user.name=a", "commit", "-q", "--allow-empty", "-m", "base"]):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)
    out = tmp_path.parent / "written-by-git"
    # As an option, git would write the diff to a file of the report's choosing.
    assert changed_lines(tmp_path, f"--output={out}") is None and not out.exists()
    assert changed_lines(tmp_path, "HEAD") is None  # a name, not an id
    head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert changed_lines(tmp_path, head) == {}
