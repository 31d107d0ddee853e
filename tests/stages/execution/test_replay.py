"""The replay's plan and folder without a gate run: which test files replay, what is laid over
this version, and the test's source as the finding shows it (docs/edited-tests.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from traingate.pipeline.model.registry import rule_for, rule_table
from traingate.pipeline.model.schema import Severity, TestRecord
from traingate.stages.execution.replay import GitTree, NotReplayed, build_view, open_tree, plan_replay, remove_view
from traingate.stages.execution.replay_checks import function_source
from traingate.stages.execution.rules import TEST_WEAKENED

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
FILES = {
    "proj/pyproject.toml": "[project]\nname = 'p'\n\n[tool.pytest.ini_options]\nmarkers = ['slow']\n",
    "proj/model.py": "RATE = 1\n",
    "proj/tests/test_a.py": "def test_a():\n    assert True\n",
    "proj/tests/test_b.py": "def test_b():\n    assert True\n",
    "proj/tests/util.py": "X = 1\n",
}


def _repo(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose target is its sub-folder `proj`, committed once."""
    for path, text in FILES.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    subprocess.run([*GIT, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "add", "-A"], cwd=tmp_path, check=True)
    subprocess.run([*GIT, "commit", "-q", "-m", "base"], cwd=tmp_path, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, check=True, capture_output=True, text=True).stdout.strip()
    return tmp_path / "proj", head


def _passed(*nodeids: str) -> list[TestRecord]:
    return [TestRecord(nodeid=n, outcome="passed", path=n.split("::")[0]) for n in nodeids]


def _tree(root: Path, commit: str) -> GitTree:
    tree = open_tree(root, commit)
    assert isinstance(tree, GitTree), tree
    return tree


def test_only_the_changed_test_file_replays_in_a_sub_folder_target(tmp_path: Path) -> None:
    root, head = _repo(tmp_path)
    (root / "tests/test_a.py").write_text("def test_a():\n    assert 1\n")
    # Not pytest's section: no test code changed by it.
    (root / "pyproject.toml").write_text(FILES["proj/pyproject.toml"].replace("name = 'p'", "name = 'q'"))
    plan = plan_replay(root, _tree(root, head), _passed("tests/test_a.py::test_a", "tests/test_b.py::test_b"))
    assert plan.files == ["tests/test_a.py"] and [t.nodeid for t in plan.tests] == ["tests/test_a.py::test_a"]
    assert plan.changed == {"tests/test_a.py": ["tests/test_a.py"]}
    assert plan.overlay["tests/test_a.py"] == FILES["proj/tests/test_a.py"] and plan.overlay["tests/conftest.py"] is None


def test_a_new_conftest_or_a_changed_helper_replays_every_file_under_it(tmp_path: Path) -> None:
    root, head = _repo(tmp_path)
    (root / "tests/conftest.py").write_text("import pytest\n")
    (root / "tests/util.py").write_text("X = 2\n")
    plan = plan_replay(root, _tree(root, head), _passed("tests/test_a.py::test_a", "tests/test_b.py::test_b"))
    assert plan.files == ["tests/test_a.py", "tests/test_b.py"]
    assert plan.changed["tests/test_a.py"] == ["tests/conftest.py", "tests/util.py"]


def test_the_view_is_this_version_with_the_baseline_test_code_laid_over_it(tmp_path: Path) -> None:
    root, head = _repo(tmp_path)
    (root / "model.py").write_text("RATE = 3\n")
    (root / "tests/conftest.py").write_text("import pytest\n")
    (root / "tests/test_a.py").write_text("def test_a():\n    pass\n")
    plan = plan_replay(root, _tree(root, head), _passed("tests/test_a.py::test_a"))
    view = build_view(root, plan.overlay)
    try:
        assert "traingate" not in str(view)
        assert (view / "model.py").read_text() == "RATE = 3\n"  # this version's code
        assert (view / "tests/test_a.py").read_text() == FILES["proj/tests/test_a.py"]  # the baseline's test
        assert not (view / "tests/conftest.py").exists()  # the baseline had none
        assert (view / "tests/test_b.py").is_symlink()
    finally:
        remove_view(view)
    assert not view.exists() and (root / "model.py").is_file()


def test_a_commit_missing_from_the_clone_says_to_fetch_deeper(tmp_path: Path) -> None:
    root, _ = _repo(tmp_path)
    missing = open_tree(root, "0" * 40)
    assert isinstance(missing, NotReplayed) and "not in this clone" in missing.reason and "fetch-depth" in missing.reason
    assert isinstance(open_tree(root, None), NotReplayed)


def test_the_source_of_a_test_function_or_method_with_its_decorators() -> None:
    text = "import pytest\n\n\nclass TestX:\n    @pytest.mark.slow\n    def test_y(self, n):\n        assert n\n\n\ndef test_z():\n    pass\n"
    assert function_source(text, "tests/t.py::TestX::test_y[1]") == "    @pytest.mark.slow\n    def test_y(self, n):\n        assert n\n"
    assert function_source(text, "tests/t.py::test_z") == "def test_z():\n    pass\n"
    assert function_source(text, "tests/t.py::test_gone") == "" and function_source("def (", "t.py::x") == ""


def test_explain_names_the_replay_and_its_sub_rules() -> None:
    rule = rule_for(TEST_WEAKENED)
    assert rule.severity is Severity.HIGH and rule.stage == "execution"
    text = rule_table().explain(rule)
    assert "baseline form" in text and "Sub-rules: test-weakened/interface-changed, test-weakened/not-replayed" in text
