"""A red suite stays red: each way of taking a failing test out of the run is seen, and against
a baseline where the test passed, it blocks.

tests/targets/exec_suite_base is the clean version (its baseline report is made once). Each
route below starts from it, breaks the trainer so that `test_loss_decreases` fails (the
learning rate's sign flipped), and takes that test out of the run one way: the version an
agent that wants its change merged would open. Every route runs once, with `--baseline`; the
findings that do not need the baseline are read from the same run.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.built_runs import built_run_once
from tests.conftest import TARGETS, GateRun, run_gate, shared_folder
from traingate.pipeline.supervision import import_server

pytestmark = pytest.mark.slow

BASE = TARGETS / "exec_suite_base"
TEST = "tests/test_trainer.py::test_loss_decreases"
BREAK_TRAINER = ("LEARNING_RATE = 0.1", "LEARNING_RATE = -0.1")

CONFTEST_SKIP = '''import pytest


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.name == "test_loss_decreases":
            item.add_marker(pytest.mark.skip(reason="flaky on CI"))
'''
CONFTEST_XFAIL = CONFTEST_SKIP.replace('pytest.mark.skip(reason="flaky on CI")', 'pytest.mark.xfail(reason="known issue")')
CONFTEST_REWRITE = '''import pytest


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        report.outcome = "passed"
        report.longrepr = None
    return report
'''
CONFTEST_SWALLOW = '''import pytest


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem):
    try:
        return (yield)
    except AssertionError:
        return True
'''
CONFTEST_FIXTURE_SKIP = '''import pytest


@pytest.fixture(autouse=True)
def _quarantine(request):
    if request.node.name == "test_loss_decreases":
        pytest.skip("quarantined")
'''
CONFTEST_SILENT_DROP = '''def pytest_collection_modifyitems(config, items):
    items[:] = [item for item in items if "loss" not in item.name]
'''
# The run ends with status 0 after the test before the failing one.
CONFTEST_EXIT = '''import os


def pytest_runtest_logfinish(nodeid, location):
    if nodeid.endswith("test_no_points_no_crash_on_zero_steps"):
        os._exit(0)
'''
CONFTEST_PYTEST_EXIT = CONFTEST_EXIT.replace("import os\n", "import pytest\n").replace("os._exit(0)", 'pytest.exit("done", returncode=0)')
CONFTEST_COLLECT_IGNORE = 'collect_ignore = ["tests/test_trainer.py"]\n'
TESTS_WITHOUT_IT = (BASE / "tests/test_trainer.py").read_text().replace(
    "def test_loss_decreases():\n    losses = fit(POINTS, steps=5)\n    assert losses[-1] < losses[0]\n\n\n", ""
)


def _addopts(opts: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        config = root / "pyproject.toml"
        config.write_text(config.read_text().replace("[tool.pytest.ini_options]\n", f"[tool.pytest.ini_options]\naddopts = {opts!r}\n"))

    return edit


def _write(path: str, text: str) -> Callable[[Path], None]:
    return lambda root: (root / path).write_text(text)


def _replace(path: str, old: str, new: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        text = (root / path).read_text()
        assert old in text
        (root / path).write_text(text.replace(old, new))

    return edit


# route: (edits, how the finding must say it was taken out, whether a finding names the test without the baseline)
ROUTES: dict[str, tuple[list[Callable[[Path], None]], str, bool]] = {
    "addopts-deselect": ([_addopts(f"--deselect {TEST}")], "--deselect", True),
    "addopts-k": ([_addopts("-k 'not loss_decreases'")], "-k", True),
    "conftest-skip": ([_write("conftest.py", CONFTEST_SKIP)], "flaky on CI", True),
    "conftest-xfail": ([_write("conftest.py", CONFTEST_XFAIL)], "known issue", True),
    "deleted": ([_write("tests/test_trainer.py", TESTS_WITHOUT_IT)], "deleted", False),
    "tests-narrowed": ([_replace("pyproject.toml", 'tests = ["tests"]', 'tests = ["tests/test_data.py"]')], "not collected", True),
    "makereport-rewrite": ([_write("conftest.py", CONFTEST_REWRITE)], "", True),
    # Variants of the same routes.
    "addopts-m": ([_addopts("-m 'not slow_gpu'"), _replace("tests/test_trainer.py", "def test_loss_decreases", "@pytest.mark.slow_gpu\ndef test_loss_decreases")], "-m", True),
    "fixture-skip": ([_write("conftest.py", CONFTEST_FIXTURE_SKIP)], "quarantined", True),
    "silent-drop": ([_write("conftest.py", CONFTEST_SILENT_DROP)], "silently removed", True),
    "collect-ignore": ([_write("conftest.py", CONFTEST_COLLECT_IGNORE)], "collect_ignore", True),
    "module-skip": ([_replace("tests/test_trainer.py", "from trainer import fit\n", "from trainer import fit\n\npytest.skip('slow', allow_module_level=True)\n")], "slow", True),
    "renamed-and-skipped": ([_replace("tests/test_trainer.py", "def test_loss_decreases", "@pytest.mark.skip(reason='flaky')\ndef test_loss_goes_down")], "flaky", True),
    "pyfunc-swallow": ([_write("conftest.py", CONFTEST_SWALLOW)], "", True),
    "early-exit": ([_write("conftest.py", CONFTEST_EXIT)], "the run ended before it", True),
    "early-pytest-exit": ([_write("conftest.py", CONFTEST_PYTEST_EXIT)], "the run ended before it", True),
}


_shared_dir = shared_folder
_once = built_run_once


@pytest.fixture(scope="session")
def baseline(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    return _once(_shared_dir(tmp_path_factory), "baseline", lambda out: run_gate(BASE, out, "--stages", "execution", "--version", "v1"))


def make_route(route: str, into: Path) -> Path:
    target = into / route
    if not target.exists():
        shutil.copytree(BASE, target)
        _replace("trainer.py", *BREAK_TRAINER)(target)
        for edit in ROUTES[route][0]:
            edit(target)
    return target


@pytest.fixture(scope="session")
def route_run(tmp_path_factory: pytest.TempPathFactory, baseline: GateRun) -> Callable[[str], GateRun]:
    shared = _shared_dir(tmp_path_factory)

    def run(route: str) -> GateRun:
        # The route's tree is written under the run's lock: another worker never sees it half made.
        return _once(shared, route, lambda out: run_gate(make_route(route, shared / "routes"), out, "--stages", "execution", "--version", "v2", "--baseline", str(baseline.out / "report.json")))

    return run


def test_the_baseline_passes_and_records_every_test(baseline: GateRun) -> None:
    assert baseline.returncode == 0, baseline.stdout
    records = {r["nodeid"]: r for r in baseline.stage("execution")["tests"]}
    assert records[TEST]["outcome"] == "passed"
    assert records["tests/test_trainer.py::test_on_gpu"]["outcome"] == "skipped"
    assert records["tests/test_trainer.py::test_on_gpu"]["taken_out"]["how"] == "skip-marker"


def test_a_suite_alone_forks_its_agent_and_its_run_from_a_served_host(baseline: GateRun) -> None:
    """No entrypoint, one stage: where the suite's import server serves the gate run, its stage
    agent and the suite's own run are forks of the agents' host the server forked (no fresh
    agent, no fresh pytest); where none serves, no host imports torch only for them
    (tests/pipeline/gate/test_orchestrator.py)."""
    started = sorted(p.parent.name for p in (baseline.out / "work").glob("*/warm-*.stdout"))
    assert started == (["agents"] if os.environ.get(import_server.SERVER_ENV) else [])


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_route_blocks_against_the_baseline(route_run: Callable[[str], GateRun], route: str) -> None:
    gate = route_run(route)
    assert gate.returncode == 1 and gate.report["decision"] == "BLOCK", gate.stdout
    blocking = [f for f in gate.findings() if f["blocking"]]
    named = [f for f in blocking if "test_loss_decreases" in f["title"] + f["problem"]]
    assert named, f"no blocking finding names the test: {[(f['category'], f['title']) for f in blocking]}"
    how = ROUTES[route][1]
    if route in ("makereport-rewrite", "pyfunc-swallow"):
        [rewritten] = [f for f in named if f["category"] == "stage-error"]
        assert rewritten["evidence"]["data"]["reason"] == "outcome-rewritten"
        assert rewritten["location"]["path"] == "conftest.py" and rewritten["location"]["line"] is not None
    else:
        [disabled] = [f for f in named if f["category"] == "test-disabled"]
        assert how in disabled["title"], disabled["title"]
        assert disabled["evidence"]["data"]["baseline_version"] == "v1"


@pytest.mark.parametrize("route", sorted(r for r, (_, _, visible) in ROUTES.items() if visible))
def test_route_is_named_without_the_baseline(route_run: Callable[[str], GateRun], route: str) -> None:
    """The findings that do not compare with the baseline still name the test (or its file)."""
    gate = route_run(route)
    wanted = "tests/test_trainer.py" if route in ("tests-narrowed", "collect-ignore", "module-skip") else "test_loss"
    own = [f for f in gate.findings() if f["category"] != "test-disabled" and wanted in json.dumps(f)]
    assert own, [(f["category"], f["title"]) for f in gate.findings()]


def test_a_rewritten_outcome_is_counted_failed(route_run: Callable[[str], GateRun]) -> None:
    gate = route_run("makereport-rewrite")
    records = {r["nodeid"]: r for r in gate.stage("execution")["tests"]}
    assert records[TEST]["outcome"] == "failed"
    assert "AssertionError" in records[TEST]["rewritten"]
    assert "rewritten" in gate.stage("execution")["summary"]


@pytest.mark.parametrize("route", ["early-exit", "early-pytest-exit"])
def test_a_run_that_ends_early_names_every_test_that_never_ran(route_run: Callable[[str], GateRun], route: str) -> None:
    gate = route_run(route)
    [ended] = [f for f in gate.findings("test-failure") if f["title"].startswith("The test run ended early")]
    never = [TEST, "tests/test_trainer.py::test_one_loss_per_step", "tests/test_trainer.py::test_on_gpu"]
    assert ended["blocking"] and ended["evidence"]["data"]["never_ran"] == never
    assert all(n in ended["problem"] for n in never) and TEST in ended["title"]
    disabled = {f["evidence"]["data"]["nodeid"] for f in gate.findings("test-disabled")}
    assert disabled == {TEST, "tests/test_trainer.py::test_one_loss_per_step"}  # test_on_gpu was skipped there


def test_an_option_names_its_source_and_line(route_run: Callable[[str], GateRun]) -> None:
    gate = route_run("addopts-k")
    [selection] = gate.findings("test-selection")
    assert selection["severity"] == "medium" and not selection["blocking"]
    assert "addopts" in selection["title"] and TEST in selection["evidence"]["data"]["removed"]
    assert selection["location"]["path"] == "pyproject.toml"
    assert selection["location"]["line"] is not None
    counted = gate.stage("execution")["summary"]
    assert "1 deselected" in counted and "of 4 collected" in counted


def test_a_renamed_test_is_followed_by_its_source(route_run: Callable[[str], GateRun]) -> None:
    gate = route_run("renamed-and-skipped")
    [disabled] = gate.findings("test-disabled")
    assert disabled["evidence"]["data"]["now"] == "tests/test_trainer.py::test_loss_goes_down"
    moved = gate.stage("execution")["details"]["pytest"]["accounting"]["baseline"]["moved"]
    assert moved == [{"from": TEST, "to": "tests/test_trainer.py::test_loss_goes_down"}]


def test_real_skips_keep_their_decision_with_a_baseline_that_had_them(tmp_path_factory: pytest.TempPathFactory, baseline: GateRun) -> None:
    """The base version against itself: its CUDA skip is no test-disabled, the decision stays PASS."""
    again = _once(_shared_dir(tmp_path_factory), "base-again", lambda out: run_gate(BASE, out, "--stages", "execution", "--baseline", str(baseline.out / "report.json")))
    assert again.returncode == 0 and again.report["decision"] == "PASS", again.stdout
    assert not again.findings("test-disabled") and not again.findings("test-selection")
    [skips] = again.findings("skipped-tests")
    assert skips["severity"] == "low"


def test_a_suite_pinned_by_the_ci_cannot_be_narrowed(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The CI's policy file pins `tests`: the narrowed version runs the whole suite, and the
    failing test fails."""
    shared = _shared_dir(tmp_path_factory)
    policy = shared / "pinned-policy.toml"

    def pinned(out: Path) -> GateRun:
        policy.write_text('tests = ["tests"]\n')
        return run_gate(make_route("tests-narrowed", shared / "pinned-route"), out, "--stages", "execution", "--policy", str(policy))

    gate = _once(shared, "pinned", pinned)
    assert gate.returncode == 1
    [failure] = gate.findings("test-failure")
    assert TEST in failure["title"]
    [pinned] = [s for s in gate.report["policy"]["settings"] if s["key"] == "tests"]
    assert pinned == {"key": "tests", "value": ["tests"], "source": "ci-policy"}
    assert any(i["key"] == "tests" for i in gate.report["policy"]["ignored"]) is False


def test_an_intended_removal_is_accepted_with_a_waiver(tmp_path_factory: pytest.TempPathFactory, baseline: GateRun) -> None:
    """A test deleted on purpose (with the trainer intact) passes once a waiver says why."""
    shared = _shared_dir(tmp_path_factory)

    def waived(out: Path) -> GateRun:
        target = shared / "waived-removal"
        if not target.exists():
            shutil.copytree(BASE, target)
            (target / "tests/test_trainer.py").write_text(TESTS_WITHOUT_IT)
            with (target / "pyproject.toml").open("a") as config:
                config.write('\n[[tool.traingate.waive]]\ncategory = "test-disabled"\npath = "tests/test_trainer.py"\nreason = "covered by test_one_loss_per_step since v2"\n')
        return run_gate(target, out, "--stages", "execution", "--baseline", str(baseline.out / "report.json"))

    gate = _once(shared, "waived", waived)
    assert gate.returncode == 0 and gate.report["decision"] == "PASS", gate.stdout
    [disabled] = gate.findings("test-disabled")
    assert disabled["waived"]["reason"].startswith("covered by") and not disabled["blocking"]
