"""The target cannot change what is checked: stages run on copies, edits to sources block."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, TARGETS, TRAINGATE, cli_env
from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Finding, Location, Severity, StageOutcome
from traingate.pipeline.gate.snapshot import Changes, Snapshot, SnapshotError, modification_finding, with_user_paths
from traingate.stages.shared_categories import ENTRYPOINT_CRASH


def tree_digest(root: Path) -> dict[str, str]:
    """Every file under root with its sha256: what 'unchanged on disk' means in these tests."""
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _plain_target(tmp_path: Path) -> Path:
    root = tmp_path / "target"
    for rel, text in {
        "trainer.py": "def step():\n    return 1\n",
        "tests/test_trainer.py": "def test_step():\n    pass\n",
        ".git/HEAD": "ref: refs/heads/main\n",
        "pkg/__pycache__/x.pyc": "cache",
        ".venv/lib/site.py": "env",
        "venv/bin/python": "env",
        "node_modules/a/index.js": "js",
        "reports/report.json": "{}",
    }.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_copy_leaves_out_caches_environments_and_the_output_folder(tmp_path: Path) -> None:
    root = _plain_target(tmp_path)
    with Snapshot(root, exclude=root / "reports") as snapshot:
        copy = snapshot.fresh_copy("execution")
        assert copy.name == root.name and not copy.is_relative_to(root)
        assert sorted(tree_digest(copy)) == ["tests/test_trainer.py", "trainer.py"]
        assert sorted(snapshot.hashes) == ["tests/test_trainer.py", "trainer.py"]
        assert snapshot.copied_files == 2
        base = snapshot.base
    assert not base.exists()


def test_changed_and_deleted_sources_are_found_and_new_files_are_fine(tmp_path: Path) -> None:
    root = _plain_target(tmp_path)
    before = tree_digest(root)
    with Snapshot(root) as snapshot:
        copy = snapshot.fresh_copy("execution")
        assert not snapshot.changes(copy)
        (copy / "trainer.py").write_text("def step():\n    return 2\n")
        (copy / "tests" / "test_trainer.py").unlink()
        (copy / "checkpoint.pt").write_bytes(b"\0" * 10)
        (copy / "logs").mkdir()
        changes = snapshot.changes(copy)
        assert changes == Changes(modified=["trainer.py"], deleted=["tests/test_trainer.py"])
        # The next stage starts from the pristine tree again.
        again = snapshot.fresh_copy("performance")
        assert not snapshot.changes(again) and not (again / "checkpoint.pt").exists()
    assert tree_digest(root) == before


def test_in_a_git_repo_ignored_files_are_not_sources(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    root.mkdir()
    (root / ".gitignore").write_text("*.ckpt\n")
    (root / "trainer.py").write_text("x = 1\n")
    (root / "wip.py").write_text("y = 2\n")  # untracked, not ignored: work in progress counts
    (root / "old.ckpt").write_text("weights")
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "trainer.py", ".gitignore"], check=True)
    subprocess.run([*git, "commit", "-qm", "init"], check=True)
    with Snapshot(root) as snapshot:
        assert sorted(snapshot.hashes) == [".gitignore", "trainer.py", "wip.py"]
        copy = snapshot.fresh_copy("execution")
        assert not (copy / ".git").exists() and (copy / "old.ckpt").is_file()
        (copy / "old.ckpt").write_text("overwritten checkpoint")
        assert not snapshot.changes(copy)


def test_copies_are_removed_even_when_the_target_locked_them_and_on_errors(tmp_path: Path) -> None:
    root = _plain_target(tmp_path)
    with pytest.raises(RuntimeError):
        with Snapshot(root) as snapshot:
            copy = snapshot.fresh_copy("execution")
            (copy / "tests").chmod(0o500)
            (copy / "trainer.py").chmod(0o400)
            base = snapshot.base
            raise RuntimeError("a stage failed")
    assert not base.exists()


def test_findings_name_the_users_files_never_the_copy(tmp_path: Path) -> None:
    copy, user = tmp_path / "snap" / "proj", Path("/home/me/proj")
    finding = Finding.create(
        stage="execution", category=ENTRYPOINT_CRASH, severity=Severity.CRITICAL,
        title="raised at trainer.py:3", location=Location(path="trainer.py", line=3), problem="p", impact="i", fix="f",
        evidence=Evidence(kind=EvidenceKind.OBSERVED, traceback=f'File "{copy}/trainer.py", line 3'), block_on={Severity.CRITICAL},
    )
    outcome = with_user_paths(StageOutcome(summary=f"ran in {copy}", findings=[finding]), copy, user)
    assert str(copy) not in outcome.model_dump_json()
    assert outcome.summary == "ran in /home/me/proj" and outcome.findings[0].id == finding.id
    assert outcome.findings[0].evidence.traceback == 'File "/home/me/proj/trainer.py", line 3'


def test_a_modification_always_blocks_and_names_the_files() -> None:
    finding = modification_finding("execution", Changes(modified=["trainer.py"], deleted=["tests/test_x.py"]))
    assert finding.category is Category.TARGET_MODIFIED and finding.blocking and finding.severity is Severity.CRITICAL
    assert "trainer.py" in finding.title and "tests/test_x.py" in finding.title
    assert finding.evidence.data == {"modified": ["trainer.py"], "deleted": ["tests/test_x.py"]}


def _run_isolated(target: Path, out: Path, scratch_tmp: Path, *args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    """The CLI with its own temporary folder, so the test can see that every copy is gone."""
    scratch_tmp.mkdir(exist_ok=True)
    done = subprocess.run(
        [*TRAINGATE, "run", str(target), "--out", str(out), *args],
        capture_output=True, text=True, cwd=REPO, timeout=600, env={**cli_env(), "TMPDIR": str(scratch_tmp)},
    )
    report = json.loads((out / "report.json").read_text()) if (out / "report.json").is_file() else {}
    return done.returncode, report, done.stderr


@pytest.mark.slow
def test_a_target_that_edits_itself_is_blocked_and_left_unchanged(tmp_path: Path) -> None:
    target = TARGETS / "self_edit"
    before = tree_digest(target)
    code, report, stderr = _run_isolated(target, tmp_path / "out", tmp_path / "tmp", "--stages", "execution")
    assert tree_digest(target) == before, "the user's tree was modified"
    assert code == 1 and report["decision"] == "BLOCK", stderr
    findings = [f for s in report["stages"] for f in s["findings"]]
    [modified] = [f for f in findings if f["category"] == "target-modified"]
    assert modified["blocking"] and modified["stage"] == "execution"
    assert modified["evidence"]["data"] == {"modified": ["trainer.py"], "deleted": ["tests/test_regression.py"]}
    # The failing test ran before the conftest deleted its file: still reported.
    [failure] = [f for f in findings if f["category"] == "test-failure"]
    assert failure["location"]["path"] == "tests/test_regression.py" and failure["blocking"]
    # Reports name the user's target, never the temporary copy.
    assert report["target"]["path"] == str(target)
    assert str(tmp_path / "tmp") not in json.dumps(report)
    assert list((tmp_path / "tmp").iterdir()) == [], "a snapshot was left behind"
    assert "target-modified" in (tmp_path / "out" / "execution.md").read_text()


@pytest.mark.slow
def test_an_out_folder_inside_the_target_is_allowed_and_never_copied(tmp_path: Path) -> None:
    target = tmp_path / "target"
    (target / "tests").mkdir(parents=True)
    (target / "tests" / "test_out_is_not_copied.py").write_text(
        "from pathlib import Path\n\n"
        "def test_no_reports_folder_in_the_copy():\n"
        "    assert not (Path(__file__).resolve().parent.parent / 'gate-out').exists()\n"
    )
    for _ in range(2):  # the second run reuses the folder holding the first run's report
        code, report, stderr = _run_isolated(target, target / "gate-out", tmp_path / "tmp", "--stages", "execution")
        assert code == 0 and report["decision"] == "PASS", stderr
        assert report["stages"][0]["findings"] == []
    assert list((tmp_path / "tmp").iterdir()) == []


def test_pipes_and_sockets_are_not_copied(tmp_path: Path) -> None:
    root = _plain_target(tmp_path)
    os.mkfifo(root / "events.fifo")  # reading it would block the copy forever
    with Snapshot(root) as snapshot:
        assert "events.fifo" not in snapshot.hashes
        assert not (snapshot.fresh_copy("execution") / "events.fifo").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="permissions do not stop root")
def test_a_target_that_cannot_be_copied_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    root = _plain_target(tmp_path)
    secret = root / "secret.py"
    secret.write_text("x = 1\n")
    secret.chmod(0)
    snapshot = Snapshot(root)
    with pytest.raises(SnapshotError) as info:
        snapshot.take()
    assert "secret.py" in str(info.value) and "\n" not in str(info.value)
    assert not snapshot.base.exists()
