"""The execution stage end to end: `traingate run <fixture> --stages execution`.

Each fixture target under tests/targets/exec_*/ plants known defects (or none, for the
clean control). The gate runs once per target, whichever xdist worker asks first; the other
workers read the cached result.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.conftest import TARGETS, GateRun
from tests.conftest import line_of as conftest_line_of

pytestmark = pytest.mark.slow

HANG_BUDGET_S = 10  # timeout_s of exec_hang


EXECUTION = ("--stages", "execution")
Shared = Callable[..., tuple[GateRun, float]]


def line_of(case: str, path: str, marker: str) -> int:
    """1-based line of the first line of a fixture file holding `marker`."""
    return conftest_line_of(TARGETS / case / path, marker)


def only(gate: GateRun, category: str) -> dict:
    found = gate.findings(category)
    assert len(found) == 1, f"expected one {category}, got {found}"
    return found[0]


def loc(finding: dict) -> tuple[str, int | None]:
    return finding["location"]["path"], finding["location"]["line"]


# -- a hanging suite (first: the longest run starts while the other worker takes the rest)


def test_hanging_suite_is_a_hang_within_the_budget(shared_gate: Shared):
    gate, _ = shared_gate("exec_hang", *EXECUTION)
    assert gate.returncode == 1
    hang = only(gate, "hang")
    assert loc(hang) == ("tests/test_wait.py", line_of("exec_hang", "tests/test_wait.py", "planted: nothing ever sets it"))
    assert "test_waits_forever" in hang["title"] and hang["blocking"] is True
    assert "test_waits_forever" in hang["evidence"]["traceback"]
    # The stage keeps its budget; the whole run also holds the gate's wait for the agents'
    # host's imports, which a busy machine stretches and which is bounded apart.
    assert gate.stage("execution")["duration_s"] <= HANG_BUDGET_S + 3
    assert "test-failure" not in gate.categories()  # the running test is the hang, not a failure


# -- the clean control ---------------------------------------------------------------------


def test_clean_control_passes(shared_gate: Shared):
    gate, _ = shared_gate("exec_clean", *EXECUTION)
    assert gate.returncode == 0, gate.stdout + gate.stderr
    assert gate.report["decision"] == "PASS"
    stage = gate.stage("execution")
    assert stage["status"] == "passed"
    assert not [f for f in stage["findings"] if f["blocking"]]
    assert gate.categories() == set()


def test_clean_control_reports_tests_smoke_call_and_coverage(shared_gate: Shared):
    gate, _ = shared_gate("exec_clean", *EXECUTION)
    stage = gate.stage("execution")
    metrics = {m["name"]: m["value"] for m in stage["metrics"]}
    assert metrics["tests_collected"] == 2 and metrics["tests_passed"] == 2 and metrics["tests_failed"] == 0
    assert metrics["entrypoint_body_statements_executed"] >= 1
    details = stage["details"]
    assert details["pytest"]["exit_status"] == 0
    assert details["pytest"]["config_file"] == "pyproject.toml"  # the target's own pytest configuration
    runs = details["smoke"]["runs"]
    # Both AMP settings, on every device; the kwargs do not set the flag, so AMP off first.
    assert [(r["label"], r["amp"], r["ok"]) for r in runs] == [("amp-off", False, True), ("amp-on", True, True)]
    assert "trained 3 steps" in runs[0]["stdout_head"]
    assert any("AMP off (the kwargs do not set it) first" in n for n in details["smoke"]["notes"])


def test_clean_control_leaves_the_target_untouched(shared_gate: Shared):
    shared_gate("exec_clean", *EXECUTION)
    leftovers = [p for p in (TARGETS / "exec_clean").rglob("*") if p.name in ("__pycache__", ".pytest_cache", ".coverage") or p.suffix == ".xml"]
    assert leftovers == []


def test_markdown_shows_results_skips_smoke_call_then_findings(shared_gate: Shared):
    gate, _ = shared_gate("exec_defects", *EXECUTION)
    md = (gate.out / "execution.md").read_text()
    order = [md.index(h) for h in ("## Test results", "### Skipped tests (4)", "## Smoke call of the entrypoint", "## Findings")]
    assert order == sorted(order)
    assert "| CUDA not available | 3:" in md
    assert "raised KeyError: 'train_data'" in md


# -- planted defects: failing test, skips, crash in a helper, untested entrypoint, deprecations


def test_failing_test_is_located_at_its_assert(shared_gate: Shared):
    gate, _ = shared_gate("exec_defects", *EXECUTION)
    assert gate.returncode == 1 and gate.report["decision"] == "BLOCK"
    failure = only(gate, "test-failure")
    assert loc(failure) == ("tests/test_model.py", line_of("exec_defects", "tests/test_model.py", "planted: fails"))
    assert failure["severity"] == "high" and failure["blocking"] is True
    assert "test_shape_is_transposed" in failure["title"]
    # The message the terminal shows in bold reads plain in the table, its pipe escaped (run_gate
    # also checks every table of every report the suite's runs write).
    row = next(line for line in (gate.out / "execution.md").read_text().splitlines() if line.startswith("| `tests/test_model.py::test_shape_is_transposed`"))
    assert "| AssertionError: shape \\| mismatch |" in row and "\x1b" not in row


def test_xfailed_test_is_not_a_failure(shared_gate: Shared):
    gate, _ = shared_gate("exec_defects", *EXECUTION)
    outcomes = {t["nodeid"].split("::")[-1]: t["outcome"] for t in gate.stage("execution")["details"]["pytest"]["tests"]}
    assert outcomes["test_known_issue"] == "xfailed"
    assert outcomes["test_addition_passes"] == "passed"


def test_skip_reasons_are_grouped(shared_gate: Shared):
    gate, _ = shared_gate("exec_defects", *EXECUTION)
    skips = {f["title"]: f for f in gate.findings("skipped-tests")}
    # The xfail is named too, at medium: an xfail hides a failure whatever put it there.
    assert set(skips) == {"3 test(s) skipped: CUDA not available", "1 test(s) skipped: needs the full dataset", "1 test(s) xfailed: known rounding issue"}
    xfail = skips.pop("1 test(s) xfailed: known rounding issue")
    assert xfail["severity"] == "medium" and not xfail["blocking"] and "test_known_issue" in xfail["problem"]
    assert all(f["severity"] == "low" and not f["blocking"] and f["evidence"]["kind"] == "observed" for f in skips.values())
    assert len(skips["3 test(s) skipped: CUDA not available"]["evidence"]["data"]["tests"]) == 3


def test_entrypoint_keyerror_is_located_in_the_helper(shared_gate: Shared):
    gate, _ = shared_gate("exec_defects", *EXECUTION)
    crash = only(gate, "entrypoint-crash")
    assert loc(crash) == ("train_loop.py", line_of("exec_defects", "train_loop.py", "planted: KeyError"))
    assert crash["location"]["function"] == "_summarise"
    assert crash["severity"] == "critical" and crash["blocking"] is True
    assert "KeyError: 'train_data'" in crash["evidence"]["traceback"]
    # The target's frames only: the harness's own (its `run`) are counted, not shown.
    shown = crash["evidence"]["traceback"]
    assert shown.startswith("Traceback (most recent call last):\n  [") and "of the gate's harness left out]" in shown.splitlines()[1]
    assert "entrypoint.py" not in shown and 'train_loop.py", line' in shown.splitlines()[2]


def test_untested_entrypoint_is_reported_not_blocking(shared_gate: Shared):
    gate, _ = shared_gate("exec_defects", *EXECUTION)
    untested = only(gate, "entrypoint-untested")
    assert loc(untested) == ("train_loop.py", line_of("exec_defects", "train_loop.py", "def fit("))
    assert untested["severity"] == "medium" and untested["blocking"] is False
    assert untested["evidence"]["kind"] == "observed"


def test_deprecated_amp_apis_in_a_test_and_in_the_entrypoint(shared_gate: Shared):
    gate, _ = shared_gate("exec_defects", *EXECUTION)
    found = {loc(f): f for f in gate.findings("deprecated-api")}
    in_test = ("tests/test_model.py", line_of("exec_defects", "tests/test_model.py", "torch.cuda.amp.autocast"))
    in_entrypoint = ("train_loop.py", line_of("exec_defects", "train_loop.py", "planted: deprecated API"))
    assert set(found) == {in_test, in_entrypoint}
    assert all(f["severity"] == "low" and f["blocking"] is False and f["evidence"]["kind"] == "observed" for f in found.values())
    assert "torch.amp.autocast('cuda'" in found[in_test]["evidence"]["data"]["message"]
    assert found[in_entrypoint]["evidence"]["data"]["sources"] == ["smoke"]


def test_a_deprecated_api_called_from_several_lines_is_one_finding_naming_each(shared_gate: Shared):
    # torch issues the weight_norm warning from one line of its own, so a filter that shows a
    # warning once per issuing line would keep only the first calling line of the target.
    gate, _ = shared_gate("exec_repeated_deprecation", *EXECUTION)
    [found] = gate.findings("deprecated-api")  # one cause, one fix: one finding
    planted = [("tcn.py", line_of("exec_repeated_deprecation", "tcn.py", f"planted: {where}")) for where in ("first call", "second call", "in a loop")]
    # Each line once: the loop's three calls from one line are one place, not three.
    places = [(p["path"], p["line"]) for p in found["evidence"]["data"]["locations"]]
    assert sorted(places) == sorted(planted) and loc(found) in planted
    assert "parametrizations.weight_norm" in found["evidence"]["data"]["message"]
    # ...but counted three times: the evidence says how often each line warned.
    raised = {(s["path"], s["line"]): s["count"] for s in found["evidence"]["data"]["sites"]}
    assert raised[planted[2]] == 3 * raised[planted[0]] == 3 * raised[planted[1]]
    assert gate.report["decision"] == "PASS"  # deprecated-api never blocks


# -- collection error and death by signal ----------------------------------------------------


def test_import_error_is_located_in_the_imported_module(shared_gate: Shared):
    gate, _ = shared_gate("exec_collect", *EXECUTION)
    assert gate.returncode == 1
    # The module the test imports needs a package that is not installed: the environment's.
    assert "collection-error" not in gate.categories()
    err = only(gate, "environment")
    assert loc(err) == ("data_utils.py", line_of("exec_collect", "data_utils.py", "planted: ModuleNotFoundError"))
    assert err["blocking"] is True and err["evidence"]["data"]["missing"] == ["tokenizers_not_installed_anywhere"]
    assert "tests/test_data.py" in err["problem"]
    assert gate.stage("execution")["details"]["pytest"]["exit_status"] == 2
    assert "no-tests" not in gate.categories()  # the collection error already explains it


def test_sigkill_in_the_entrypoint_is_located_at_the_kill(shared_gate: Shared):
    gate, _ = shared_gate("exec_collect", *EXECUTION)
    crash = only(gate, "entrypoint-crash")
    assert loc(crash) == ("runner.py", line_of("exec_collect", "runner.py", "planted: death by signal"))
    assert crash["evidence"]["data"]["signal"] == "SIGKILL"
    assert crash["blocking"] is True


# -- nothing ran -------------------------------------------------------------------------------


def test_suite_without_tests_blocks(shared_gate: Shared):
    gate, _ = shared_gate("exec_empty", *EXECUTION)
    assert gate.returncode == 1
    no_tests = only(gate, "no-tests")
    assert no_tests["blocking"] is True
    details = gate.stage("execution")["details"]
    assert details["pytest"]["exit_status"] == 5
    assert details["smoke"]["configured"] is False and "no entrypoint" in details["smoke"]["notes"][0]


def test_pytest_exiting_zero_having_run_nothing_fails_closed(shared_gate: Shared):
    gate, _ = shared_gate("exec_exit_zero", *EXECUTION)
    assert gate.stage("execution")["details"]["pytest"]["exit_status"] == 0
    assert gate.returncode == 1 and gate.report["decision"] == "BLOCK"
    no_tests = only(gate, "no-tests")
    assert no_tests["blocking"] is True and "status 0" in no_tests["problem"]


def test_pytest_exit_zero_from_a_hook_fails_closed_at_the_exit(shared_gate: Shared):
    gate, _ = shared_gate("exec_hook_exit", *EXECUTION)
    assert gate.stage("execution")["details"]["pytest"]["exit_status"] == 0
    assert gate.returncode == 1
    no_tests = only(gate, "no-tests")
    assert loc(no_tests) == ("tests/conftest.py", line_of("exec_hook_exit", "tests/conftest.py", "planted: exits 0"))
    assert no_tests["blocking"] is True and "nothing to run today" in no_tests["problem"]
