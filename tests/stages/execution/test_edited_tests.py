"""The change's own tests are not the judge of the change (docs/edited-tests.md).

tests/targets/edit_base is the clean version, committed in a git repository made here; its
baseline report records that commit. Each route below breaks the trainer (learning rate 0.05 ->
3.0, so `test_loss_decreases` fails) and edits the tests so that the suite stays green, the way
an author that wants its change merged would; against the baseline, the test's baseline form
is replayed on the version and the gate blocks. A renamed argument with its tests updated is
medium and passes; an intended change of behaviour blocks until a waiver says why.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, run_gate
from tests.built_runs import built_run_once as _once
from tests.conftest import shared_folder as _shared_dir

pytestmark = pytest.mark.slow

BASE = TARGETS / "edit_base"
TEST = "tests/test_trainer.py::test_loss_decreases"
BREAK = ("LEARNING_RATE = 0.05", "LEARNING_RATE = 3.0")
ASSERTION = "    assert losses[-1] < losses[0]\n"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]

HELPERS = "def check_losses(losses):\n    assert losses[-1] < losses[0]\n"
WEAK_HELPERS = "def check_losses(losses):\n    assert len(losses) == 6\n"
STRICT = "\n[tool.traingate.policy]\ninterface_changes_block = true\n"
CONFTEST_RATE = '''import pytest

import trainer


@pytest.fixture(autouse=True)
def _stable_rate(monkeypatch):
    monkeypatch.setattr(trainer, "LEARNING_RATE", 0.05)
'''
WAIVER = "".join(
    f'\n[[tool.traingate.waive]]\ncategory = "test-weakened"\npath = "{path}"\nreason = "train() returns the initial loss too since v2"\n'
    for path in ("tests/test_trainer.py", "tests/test_shapes.py")
)


def _replace(path: str, old: str, new: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        text = (root / path).read_text()
        assert old in text, (path, old)
        (root / path).write_text(text.replace(old, new))

    return edit


def _write(path: str, text: str) -> Callable[[Path], None]:
    return lambda root: (root / path).write_text(text)


def _helper_version(root: Path) -> None:
    """The base's assertion moved into a helper module (committed in the baseline too)."""
    (root / "tests/helpers.py").write_text(HELPERS)
    _replace("tests/test_trainer.py", "from trainer import train\n", "from trainer import train\n\nfrom helpers import check_losses\n")(root)
    _replace("tests/test_trainer.py", ASSERTION, "    check_losses(losses)\n")(root)


RENAME = [
    _replace("trainer.py", "def train(steps: int = 6,", "def train(n_steps: int = 6,"),
    _replace("trainer.py", "range(steps)", "range(n_steps)"),
    _replace("tests/test_trainer.py", "train(steps=", "train(n_steps="),
    _replace("tests/test_shapes.py", "train(steps=", "train(n_steps="),
]
INTENDED = [
    _replace("trainer.py", "weight, losses = 0.0, []", "weight, losses = 0.0, [sum(y * y for _, y in POINTS) / len(POINTS)]"),
    _replace("tests/test_trainer.py", "len(train(steps=3)) == 3", "len(train(steps=3)) == 4"),
    _replace("tests/test_shapes.py", "train(steps=0) == []", "len(train(steps=0)) == 1"),
]
# route: (the repository's base edits (committed with the baseline), the version's edits)
ROUTES: dict[str, tuple[list[Callable[[Path], None]], list[Callable[[Path], None]]]] = {
    "assertion-weakened": ([], [_replace("trainer.py", *BREAK), _replace("tests/test_trainer.py", ASSERTION, "    assert len(losses) == 6\n")]),
    "good-argument-in-test": ([], [_replace("trainer.py", *BREAK), _replace("tests/test_trainer.py", "train(steps=6)", "train(steps=6, lr=0.05)")]),
    # Variants: the weakening in a helper module the test body calls, or a new conftest fixture.
    "helper-weakened": ([_helper_version], [_replace("trainer.py", *BREAK), _write("tests/helpers.py", WEAK_HELPERS)]),
    "conftest-fixes-rate": ([], [_replace("trainer.py", *BREAK), _write("tests/conftest.py", CONFTEST_RATE)]),
    "renamed-argument": ([], RENAME),
    "renamed-argument-strict": ([], [*RENAME, lambda root: (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + STRICT)]),
    "intended-change": ([], INTENDED),
    "intended-change-waived": ([], [*INTENDED, lambda root: (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + WAIVER)]),
    # The same waiver with the CI's approval of new waivers (a change does not waive its own findings).
    "intended-change-waived-approved": ([], [*INTENDED, lambda root: (root / "pyproject.toml").write_text((root / "pyproject.toml").read_text() + WAIVER)]),
    "unchanged": ([], []),
}


def _git(root: Path, *args: str) -> None:
    subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True, timeout=60)


def make_repo(into: Path, base_edits: list[Callable[[Path], None]]) -> Path:
    """tests/targets/edit_base (with the base edits) committed in a fresh repository."""
    shutil.copytree(BASE, into)
    for edit in base_edits:
        edit(into)
    _git(into, "init", "-q")
    _git(into, "add", "-A")
    _git(into, "commit", "-q", "-m", "base")
    return into


@pytest.fixture(scope="session")
def edit_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], GateRun]:
    """One gate run per route: the baseline of its base repository (made once per base), then
    the version, edited in a copy of that repository (its history holds the baseline's commit)."""
    shared = _shared_dir(tmp_path_factory)
    repos = shared / "edit-repos"

    def baseline(name: str, base_edits: list[Callable[[Path], None]]) -> GateRun:
        return _once(shared, f"edit-base-{name}", lambda out: run_gate(make_repo(repos / f"base-{name}", base_edits), out, "--stages", "execution", "--version", "v1"))

    def run(route: str) -> GateRun:
        base_edits, edits = ROUTES.get(route, ROUTES["assertion-weakened"])
        name = "helper" if base_edits else "plain"
        base = baseline(name, base_edits)
        assert base.returncode == 0, base.stdout

        def make(out: Path) -> GateRun:
            # "not-in-clone": the same files, committed in a repository of its own (no baseline commit).
            repo = make_repo(repos / route, base_edits) if route == "not-in-clone" else Path(shutil.copytree(repos / f"base-{name}", repos / route, symlinks=True))
            for edit in edits:
                edit(repo)
            policy = []
            if route.endswith("-approved"):
                (repos / "approve-new-waivers.toml").write_text("allow_new_waivers = true\n")
                policy = ["--policy", str(repos / "approve-new-waivers.toml")]
            return run_gate(repo, out, "--stages", "execution", "--version", "v2", "--baseline", str(base.out / "report.json"), *policy)

        return _once(shared, f"edit-{route}", make)

    return run


def _blocking_names_the_test(gate: GateRun) -> dict:
    assert gate.returncode == 1 and gate.report["decision"] == "BLOCK", gate.stdout
    [weakened] = [f for f in gate.findings("test-weakened") if f["blocking"]]
    assert TEST in weakened["title"] and weakened["severity"] == "high"
    return weakened


@pytest.mark.parametrize("route", ["assertion-weakened", "good-argument-in-test", "helper-weakened", "conftest-fixes-rate"])
def test_a_route_that_edits_the_broken_test_blocks(edit_run: Callable[[str], GateRun], route: str) -> None:
    gate = edit_run(route)
    weakened = _blocking_names_the_test(gate)
    data = weakened["evidence"]["data"]
    assert data["baseline_version"] == "v1" and data["replay_outcome"] == "failed" and data["current_outcome"] == "passed"
    assert data["error"].startswith("AssertionError") and "assert" in weakened["evidence"]["traceback"]
    assert weakened["location"]["path"] == "tests/test_trainer.py"
    # Only the test files whose test code changed replayed: a helper or conftest of the folder is
    # test code of every file in it; a changed test file is its own tests' alone.
    replay = gate.stage("execution")["details"]["pytest"]["accounting"]["replay"]
    shared_code = route in ("helper-weakened", "conftest-fixes-rate")
    assert replay["files"] == (["tests/test_shapes.py"] if shared_code else []) + ["tests/test_trainer.py"]
    others = {"tests/test_shapes.py::test_no_steps_no_losses": "passed"} if shared_code else {}
    assert {r["nodeid"]: r["verdict"] for r in replay["tests"]} == {TEST: "weakened", "tests/test_trainer.py::test_one_loss_per_step": "passed", **others}


def test_the_finding_carries_the_diff_of_the_test(edit_run: Callable[[str], GateRun]) -> None:
    weakened = _blocking_names_the_test(edit_run("good-argument-in-test"))
    diff = weakened["evidence"]["data"]["diff"]
    assert "-    losses = train(steps=6)\n" in diff and "+    losses = train(steps=6, lr=0.05)\n" in diff
    assert weakened["evidence"]["data"]["changed"] == ["tests/test_trainer.py"]


def test_a_changed_helper_or_conftest_replays_its_tests(edit_run: Callable[[str], GateRun]) -> None:
    assert _blocking_names_the_test(edit_run("helper-weakened"))["evidence"]["data"]["changed"] == ["tests/helpers.py"]
    assert _blocking_names_the_test(edit_run("conftest-fixes-rate"))["evidence"]["data"]["changed"] == ["tests/conftest.py"]


def test_a_renamed_argument_with_its_tests_updated_is_medium_and_passes(edit_run: Callable[[str], GateRun]) -> None:
    gate = edit_run("renamed-argument")
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    changed = gate.findings("test-weakened")
    assert {f["rule"] for f in changed} == {"test-weakened/interface-changed"} and len(changed) == 3
    assert all(f["severity"] == "medium" and not f["blocking"] for f in changed)
    named = {f["evidence"]["data"]["nodeid"]: f for f in changed}
    assert TEST in named and "TypeError" in named[TEST]["title"] and "its current form passed" in named[TEST]["title"]


def test_the_policy_can_make_an_interface_change_block(edit_run: Callable[[str], GateRun]) -> None:
    gate = edit_run("renamed-argument-strict")
    assert gate.returncode == 1, gate.stdout
    changed = gate.findings("test-weakened")
    assert len(changed) == 3 and all(f["rule"] == "test-weakened/interface-changed" and f["severity"] == "high" and f["blocking"] for f in changed)


def test_an_intended_change_of_behaviour_blocks_and_passes_with_a_waiver(edit_run: Callable[[str], GateRun]) -> None:
    gate = edit_run("intended-change")
    assert gate.returncode == 1, gate.stdout
    weakened = {f["evidence"]["data"]["nodeid"] for f in gate.findings("test-weakened") if f["blocking"]}
    assert weakened == {"tests/test_trainer.py::test_one_loss_per_step", "tests/test_shapes.py::test_no_steps_no_losses"}
    # A waiver the change itself adds needs the CI's approval: without it the findings still block.
    unapproved = edit_run("intended-change-waived")
    assert unapproved.returncode == 1, unapproved.stdout
    assert {w["status"] for w in unapproved.report["acceptance"]["waivers"]} == {"needs-approval"}
    assert all(f["blocking"] and not f.get("waived") for f in unapproved.findings("test-weakened"))
    waived = edit_run("intended-change-waived-approved")
    assert waived.returncode == 0 and waived.report["decision"] == "PASS", waived.stdout
    accepted = waived.findings("test-weakened")
    assert len(accepted) == 2 and all(f["waived"]["reason"].startswith("train() returns") and not f["blocking"] for f in accepted)


def test_unchanged_tests_are_not_replayed(edit_run: Callable[[str], GateRun]) -> None:
    gate = edit_run("unchanged")
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    assert not gate.findings("test-weakened")
    replay = gate.stage("execution")["details"]["pytest"]["accounting"]["replay"]
    assert replay["tests"] == [] and "no test code changed" in replay["note"]


def test_a_baseline_commit_missing_from_the_clone_is_said(edit_run: Callable[[str], GateRun]) -> None:
    gate = edit_run("not-in-clone")
    [missing] = gate.findings("test-weakened")
    assert missing["rule"] == "test-weakened/not-replayed" and missing["severity"] == "medium" and not missing["blocking"]
    assert "not in this clone" in missing["title"] and "fetch-depth" in missing["title"]
    assert TEST in missing["evidence"]["data"]["tests"]


def test_a_trainer_that_behaves_only_under_the_gate_is_blocked(shared_gate: Callable[..., tuple[GateRun, float]]) -> None:
    """tests/targets/edit_sniffing takes the good learning rate only where it sees the gate's name
    (a module, an argument, the environment, a folder, its parent's command line); its own
    test and its entrypoint fail where they see it. No baseline: the suite's run shows nothing."""
    gate, _ = shared_gate("edit_sniffing", "--stages", "execution")
    assert gate.returncode == 1 and gate.report["decision"] == "BLOCK", gate.stdout
    [failure] = [f for f in gate.findings("test-failure") if f["blocking"]]
    assert TEST in failure["title"]
    outcomes = {r["nodeid"]: (r["outcome"], r["message"]) for r in gate.stage("execution")["tests"]}
    assert outcomes["tests/test_sees.py::test_where_the_gate_shows"][0] == "passed", outcomes
    assert not gate.findings("entrypoint-crash") and "smoke call ok" in gate.stage("execution")["summary"]
