"""The change does not choose how it is verified (docs/configuration.md, "The baseline's
verification is the floor").

tests/targets/verify_base is the clean version, committed in a git repository made here; its
baseline report records that commit. Each route breaks something and, in the same commit, edits
the gate's own configuration in the target (or writes a waiver) so that the broken code is not
what the gate runs, or what it finds is waived. Against the baseline every route blocks, with a
finding that names the key or the waiver and shows the baseline's value beside the change's.
The controls (a test path added, the entrypoint renamed with its callers, a change the CI
accepts, a waiver the baseline already had) do not block.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, line_of, run_gate
from tests.built_runs import built_run_once as _once
from tests.conftest import shared_folder as _shared_dir

pytestmark = pytest.mark.slow

BASE = TARGETS / "verify_base"
GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
# Breaks what users run: fit() with the default rate now raises (the loss does not fall).
BREAK_FIT = ("LEARNING_RATE = 0.05", "LEARNING_RATE = 3.0")
# Breaks what only a test sees.
BREAK_ERROR = ("abs(weight * x - y)", "abs(weight * x - y) * 5")
RAISE_LINE = "raise RuntimeError"
SAFE_FIT = '\n\ndef fit_checked(steps: int = 6) -> dict[str, float]:\n    return fit(steps, lr=0.05)\n'
KNOWN_FAILURE = "def test_known_gap():\n    assert False, 'documented gap'\n"
KNOWN_WAIVER = '\n[[tool.traingate.waive]]\ncategory = "test-failure"\npath = "tests/test_known.py"\nreason = "a documented gap, accepted"\n'
ACCEPT = "allow_config_changes = true\n"


def _replace(path: str, old: str, new: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        text = (root / path).read_text()
        assert old in text, (path, old)
        (root / path).write_text(text.replace(old, new))

    return edit


def _append(path: str, text: str) -> Callable[[Path], None]:
    return lambda root: (root / path).write_text(((root / path).read_text() if (root / path).exists() else "") + text)


def _write(path: str, text: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)

    return edit


def _inline_waiver(root: Path) -> None:
    _replace("trainer.py", "raise RuntimeError(f\"the loss did not fall: {losses[0]:.3g} -> {losses[-1]:.3g}\")",
             "raise RuntimeError(f\"the loss did not fall: {losses[0]:.3g} -> {losses[-1]:.3g}\")  # traingate: ignore[entrypoint-crash] rate tuning in progress")(root)


def _known_gap(root: Path) -> None:
    """A failing test the baseline already waived (committed with the baseline)."""
    (root / "tests/test_known.py").write_text(KNOWN_FAILURE)
    _append("pyproject.toml", KNOWN_WAIVER)(root)


RENAME = [
    _replace("trainer.py", "def fit(", "def train_model("),
    _replace("pyproject.toml", 'call = "trainer:fit"', 'call = "trainer:train_model"'),
]
# route: (the repository's base edits (committed with the baseline), the version's edits, CI policy text or None)
ROUTES: dict[str, tuple[list[Callable[[Path], None]], list[Callable[[Path], None]], str | None]] = {
    "suite-switched-off": ([], [_replace(*(("trainer.py",) + BREAK_ERROR)), _replace("pyproject.toml", 'tests = ["tests"]', "tests = false")], None),
    "call-redirected": ([], [_replace(*(("trainer.py",) + BREAK_FIT)), _append("trainer.py", SAFE_FIT), _replace("pyproject.toml", 'call = "trainer:fit"', 'call = "trainer:fit_checked"')], None),
    "keyword-added": ([], [_replace(*(("trainer.py",) + BREAK_FIT)), _replace("pyproject.toml", "kwargs = { steps = 6 }", "kwargs = { steps = 6, lr = 0.05 }")], None),
    "inline-waiver-added": ([], [_replace(*(("trainer.py",) + BREAK_FIT)), _inline_waiver], None),
    # Variants: the waiver in the table, the configuration moved to a traingate.toml that shadows pyproject.toml.
    "table-waiver-added": ([], [_replace(*(("trainer.py",) + BREAK_FIT)), _append("pyproject.toml", '\n[[tool.traingate.waive]]\ncategory = "entrypoint-crash"\npath = "trainer.py"\nreason = "rate tuning in progress"\n')], None),
    "shadowing-file": ([], [_replace(*(("trainer.py",) + BREAK_ERROR)), _write("traingate.toml", 'tests = ["tests/test_trainer.py::test_one_loss_per_step"]\n\n[entrypoint]\ncall = "trainer:fit"\nkwargs = { steps = 6 }\n')], None),
    "entrypoint-removed": ([], [_replace(*(("trainer.py",) + BREAK_FIT)), _replace("pyproject.toml", '[tool.traingate.entrypoint]\ncall = "trainer:fit"\nkwargs = { steps = 6 }\n', "")], None),
    # Controls.
    "test-added": ([], [_write("tests_more/test_more.py", "from trainer import descend\n\n\ndef test_losses_fall():\n    losses = descend(6, 0.05)\n    assert losses[-1] < losses[0]\n"), _replace("pyproject.toml", 'tests = ["tests"]', 'tests = ["tests", "tests_more"]')], None),
    "entrypoint-renamed": ([], RENAME, None),
    "accepted-by-ci": ([], [_replace("pyproject.toml", "kwargs = { steps = 6 }", "kwargs = { steps = 8 }")], ACCEPT),
    "baseline-waiver-kept": ([_known_gap], [_replace("trainer.py", '"""A tiny trainer', '"""A tiny trainer (v2)')], None),
    "new-waiver-approved-by-ci": ([], [_replace(*(("trainer.py",) + BREAK_FIT)), _inline_waiver], "allow_new_waivers = true\n"),
}


def _git(root: Path, *args: str) -> None:
    subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True, timeout=60)


def make_repo(into: Path, base_edits: list[Callable[[Path], None]]) -> Path:
    shutil.copytree(BASE, into)
    for edit in base_edits:
        edit(into)
    _git(into, "init", "-q")
    _git(into, "add", "-A")
    _git(into, "commit", "-q", "-m", "base")
    return into


@pytest.fixture(scope="session")
def floor_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], GateRun]:
    """One gate run per route, against the baseline report of its base repository (made once per base)."""
    shared = _shared_dir(tmp_path_factory)
    repos = shared / "floor-repos"

    def baseline(name: str, base_edits: list[Callable[[Path], None]]) -> GateRun:
        return _once(shared, f"floor-base-{name}", lambda out: run_gate(make_repo(repos / f"base-{name}", base_edits), out, "--stages", "execution", "--version", "v1"))

    def run(route: str) -> GateRun:
        base_edits, edits, ci = ROUTES[route]
        name = "known-gap" if base_edits else "plain"
        base = baseline(name, base_edits)
        assert base.returncode == 0, base.stdout

        def make(out: Path) -> GateRun:
            repo = Path(shutil.copytree(repos / f"base-{name}", repos / route, symlinks=True))
            for edit in edits:
                edit(repo)
            _git(repo, "add", "-A")
            _git(repo, "commit", "-q", "-m", route)
            policy = []
            if ci is not None:
                (repos / f"{route}.policy.toml").write_text(ci)
                policy = ["--policy", str(repos / f"{route}.policy.toml")]
            return run_gate(repo, out, "--stages", "execution", "--version", "v2", "--baseline", str(base.out / "report.json"), *policy)

        return _once(shared, f"floor-{route}", make)

    return run


def _narrowed(gate: GateRun, key: str) -> dict:
    assert gate.returncode == 1 and gate.report["decision"] == "BLOCK", gate.stdout
    found = [f for f in gate.findings("verification-narrowed") if f["blocking"] and f["evidence"]["data"].get("changes", [{}])[0].get("key") == key]
    assert len(found) == 1, [f["title"] for f in gate.findings("verification-narrowed")]
    assert found[0]["stage"] == "configuration" and found[0]["severity"] == "high" and f"`{key}`" in found[0]["title"]
    return found[0]


def test_a_suite_switched_off_blocks(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("suite-switched-off")
    found = _narrowed(gate, "tests")
    change = found["evidence"]["data"]["changes"][0]
    assert change == {"key": "tests", "baseline": ["tests"], "current": False, "effect": "narrows"}
    assert '["tests"]' in found["title"] and "false" in found["title"]
    assert '- "tests": [' in found["evidence"]["data"]["diff"] and '+ "tests": false' in found["evidence"]["data"]["diff"]
    assert found["location"]["path"] == "pyproject.toml"


def test_an_entrypoint_pointed_elsewhere_blocks_and_the_baseline_entrypoint_runs(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("call-redirected")
    change = _narrowed(gate, "entrypoint.call")["evidence"]["data"]["changes"][0]
    assert change["baseline"] == "trainer:fit" and change["current"] == "trainer:fit_checked"
    # The baseline's entrypoint, smoke-called on this version, crashes where users would.
    [crash] = gate.findings("entrypoint-crash")
    assert crash["blocking"] and "baseline's entrypoint trainer:fit" in crash["title"]
    assert crash["location"]["path"] == "trainer.py" and crash["location"]["line"] == line_of(BASE / "trainer.py", RAISE_LINE)
    runs = gate.stage("execution")["details"]["smoke"]["runs"]
    assert [(r["label"], r["ok"]) for r in runs] == [("smoke", True), ("baseline-smoke", False)]
    assert gate.report["verification"]["baseline_entrypoint"] == "trainer:fit"


def test_a_keyword_added_to_the_entrypoint_blocks(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("keyword-added")
    change = _narrowed(gate, "entrypoint.kwargs.lr")["evidence"]["data"]["changes"][0]
    assert change["baseline"] is None and change["current"] == 0.05
    assert [f["blocking"] for f in gate.findings("entrypoint-crash")] == [True]


@pytest.mark.parametrize("route", ["inline-waiver-added", "table-waiver-added"])
def test_a_waiver_the_change_adds_does_not_apply(floor_run: Callable[[str], GateRun], route: str) -> None:
    gate = floor_run(route)
    assert gate.returncode == 1, gate.stdout
    [crash] = gate.findings("entrypoint-crash")
    assert crash["blocking"] and not crash.get("waived")
    [waiver] = [w for w in gate.report["acceptance"]["waivers"]]
    assert waiver["status"] == "needs-approval" and waiver["added"] is True and waiver["matched"] == [crash["id"]]
    [named] = [f for f in gate.findings("verification-narrowed") if f["blocking"]]
    assert waiver["origin"] in named["title"] and named["evidence"]["data"]["baseline"] is None
    if route == "inline-waiver-added":
        assert named["location"] == {"path": "trainer.py", "line": line_of(BASE / "trainer.py", RAISE_LINE), "function": None}
    assert gate.report["verification"]["new_waivers"][0]["status"] == "needs-approval"


def test_an_entrypoint_removed_blocks_and_the_baselines_still_runs(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("entrypoint-removed")
    change = _narrowed(gate, "entrypoint")["evidence"]["data"]["changes"][0]
    assert change["baseline"] == {"call": "trainer:fit", "kwargs": {"steps": 6}} and change["current"] is None
    [crash] = gate.findings("entrypoint-crash")
    assert crash["blocking"] and "baseline's entrypoint trainer:fit" in crash["title"]
    assert [r["label"] for r in gate.stage("execution")["details"]["smoke"]["runs"]] == ["baseline-smoke"]


def test_a_traingate_toml_that_shadows_pyproject_blocks(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("shadowing-file")
    found = _narrowed(gate, "tests")
    assert found["evidence"]["data"]["baseline_file"] == "pyproject.toml" and found["evidence"]["data"]["current_file"] == "traingate.toml"
    changes = {c["key"]: c for c in gate.report["verification"]["changes"]}
    assert changes["(file)"]["baseline"] == "pyproject.toml" and changes["(file)"]["current"] == "traingate.toml"


def test_a_test_path_added_is_listed_and_passes(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("test-added")
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    assert not gate.findings("verification-narrowed")
    [change] = gate.report["verification"]["changes"]
    assert change["key"] == "tests" and change["effect"] == "widens" and change["action"].startswith("listed")
    assert "What this change changed in how it is verified" in (gate.out / "report.md").read_text()


def test_an_entrypoint_renamed_with_its_callers_is_medium_and_passes(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("entrypoint-renamed")
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    [changed] = gate.findings("verification-narrowed")
    assert changed["rule"] == "verification-narrowed/interface-changed" and changed["severity"] == "medium" and not changed["blocking"]
    assert changed["stage"] == "execution" and "trainer:fit" in changed["title"] and "AttributeError" in changed["title"]
    assert [(r["label"], r["ok"]) for r in gate.stage("execution")["details"]["smoke"]["runs"]] == [("smoke", True), ("baseline-smoke", False)]
    # The call's difference is listed, not blocking: the files say the baseline's function is gone.
    [call] = [c for c in gate.report["verification"]["changes"] if c["key"] == "entrypoint.call"]
    assert call["action"].startswith("interface changed") and "defines no 'fit'" in call["action"]


def test_a_change_the_ci_accepts_passes(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("accepted-by-ci")
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    [accepted] = gate.findings("verification-narrowed")
    assert accepted["rule"] == "verification-narrowed/accepted" and accepted["severity"] == "info" and not accepted["blocking"]
    assert gate.report["verification"]["baseline_entrypoint"] is None


def test_a_waiver_the_baseline_had_still_applies(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("baseline-waiver-kept")
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    [waiver] = gate.report["acceptance"]["waivers"]
    assert waiver["status"] == "applied" and waiver["added"] is False
    assert not gate.findings("verification-narrowed") and gate.report["verification"]["changes"] == []


def test_the_ci_can_approve_new_waivers(floor_run: Callable[[str], GateRun]) -> None:
    gate = floor_run("new-waiver-approved-by-ci")
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    [crash] = gate.findings("entrypoint-crash")
    assert crash["waived"] and not crash["blocking"]
