"""Repos as they are: no test suite, tests that need the network or an optional package,
and a run limited with --stages. End to end through the installed console script."""

from __future__ import annotations

import pytest

from tests.conftest import TARGETS, line_of, run_gate

pytestmark = pytest.mark.slow


def test_declared_no_suite_runs_no_pytest_but_says_so_everywhere(gate):
    run = gate("exec_no_suite", "--stages", "execution")
    assert run.returncode == 0, run.stderr
    stage = run.stage("execution")
    # The planted failing test would block if pytest had run.
    assert "test-failure" not in run.categories()
    assert stage["details"]["pytest"] == {"declared": False, "note": stage["details"]["pytest"]["note"]}
    assert "no test suite declared" in stage["summary"]
    [declared] = run.findings("no-tests")
    assert declared["severity"] == "info" and declared["blocking"] is False
    assert any(m["id"] == "tests.suite" and m["value"] == "not declared" for m in stage["metrics"])
    # The smoke call still ran.
    assert [r["ok"] for r in stage["details"]["smoke"]["runs"]] == [True]
    assert "smoke call ok" in stage["summary"]
    for page in ("report.md", "execution.md"):
        assert "no test suite declared" in (run.out / page).read_text().lower(), page
    assert "no test suite declared" in run.stdout


def test_empty_tests_list_is_a_configuration_error(gate):
    run = gate("exec_empty_tests_list", "--stages", "execution")
    assert run.returncode == 2
    [error] = run.findings("config-error")
    assert error["problem"].startswith("traingate.toml: traingate.tests:")
    assert "tests = false" in error["problem"]
    assert "()" not in error["problem"] + error["fix"]


def test_stages_left_out_are_listed_with_their_reason(gate):
    run = gate("exec_no_suite", "--stages", "execution")
    not_run = {n["name"]: n["reason"] for n in run.report["stages_not_run"]}
    assert not_run == {"performance": "not requested with --stages", "concurrency": "not requested with --stages", "correctness": "not requested with --stages"}
    report_md = (run.out / "report.md").read_text()
    assert "**performance**: not requested with --stages" in report_md
    assert any(line.split()[:3] == ["concurrency", "not", "run"] for line in run.stdout.splitlines())


ENV_TESTS = "tests/test_suite.py"


def test_environment_failures_do_not_block_only_the_real_failures_do(gate):
    run = gate("exec_environment", "--stages", "execution")
    assert run.returncode == 1
    target = TARGETS / "exec_environment" / ENV_TESTS
    env = {f["location"]["function"]: f for f in run.findings("test-environment")}
    assert set(env) == {"test_downloads_the_vocabulary", "test_plots_the_curve"}
    assert all(f["severity"] == "low" and not f["blocking"] for f in env.values())
    assert env["test_downloads_the_vocabulary"]["evidence"]["data"]["environment"]["kind"] == "network"
    assert env["test_downloads_the_vocabulary"]["location"]["line"] == line_of(target, "# needs the network")
    assert "not network" in env["test_downloads_the_vocabulary"]["fix"]
    missing = env["test_plots_the_curve"]
    assert missing["evidence"]["data"]["environment"]["package"] == "traingate_fixture_missing_plotting_package"
    assert "Install 'traingate_fixture_missing_plotting_package'" in missing["fix"]
    failures = {f["location"]["function"]: f for f in run.findings("test-failure")}
    # A real assert, an assert raised while handling a network error, and an import of a name
    # the target's own module lacks are defects of the code.
    assert set(failures) == {"test_scale_doubles", "test_network_error_handled_then_real_assert", "test_own_module_lacks_a_name"}
    assert all(f["blocking"] for f in failures.values())
    assert failures["test_scale_doubles"]["location"]["line"] == line_of(target, "# real failure of scale")
    stage = run.stage("execution")
    assert "suite incomplete: 2 test(s) could not run here" in stage["summary"]
    assert next(m for m in stage["metrics"] if m["id"] == "tests.environment")["value"] == 2
    assert "suite incomplete" in (run.out / "execution.md").read_text()


def test_policy_can_make_environment_failures_block(gate, tmp_path):
    policy = tmp_path / "ci-policy.toml"
    policy.write_text("test_environment_blocks = true\n")
    run = gate("exec_environment", "--stages", "execution", "--policy", str(policy))
    env = run.findings("test-environment")
    assert len(env) == 2 and all(f["severity"] == "high" and f["blocking"] for f in env)


def test_only_environment_failures_pass_with_an_incomplete_suite(gate, tmp_path):
    target = tmp_path / "repo"
    (target / "tests").mkdir(parents=True)
    (target / "traingate.toml").write_text('task = "ENV-ONLY"\ntimeout_s = 60\n')
    (target / "tests" / "test_ok.py").write_text(
        "import socket\n\n\ndef test_ok():\n    assert 1 + 1 == 2\n\n\ndef test_fetch():\n    socket.getaddrinfo('example.invalid', 443)\n"
    )
    run = gate(target, "--stages", "execution")
    assert run.returncode == 0, run.stdout
    assert [f["category"] for f in run.findings()] == ["test-environment"]
    assert "suite incomplete: 1 test(s)" in run.stage("execution")["summary"]
    # Nothing but environment failures: nothing was verified, the stage fails closed.
    (target / "tests" / "test_ok.py").write_text("import socket\n\n\ndef test_fetch():\n    socket.getaddrinfo('example.invalid', 443)\n")
    run = run_gate(target, tmp_path / "out2", "--stages", "execution")
    assert run.returncode == 1
    [no_tests] = run.findings("no-tests")
    assert no_tests["blocking"] and "could not run here" in no_tests["problem"]
