"""Repos as they are: no test suite, tests that need the network or an optional package,
and a run limited with --stages. End to end through the installed console script."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import TARGETS, line_of, run_gate

pytestmark = pytest.mark.slow


def test_declared_no_suite_runs_no_pytest_but_says_so_everywhere(shared_gate):
    run, _ = shared_gate("exec_no_suite", "--stages", "execution")
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


def test_stages_left_out_are_listed_with_their_reason(shared_gate):
    run, _ = shared_gate("exec_no_suite", "--stages", "execution")
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


HUB_TESTS = "tests/test_hub_weights.py"


def test_module_importing_a_missing_package_is_the_environment_and_nothing_ran_blocks(gate):
    # The shape of karpathy/minGPT's tests/test_huggingface_import.py (`from transformers import ...`
    # at the top of the module, on a runner without transformers).
    run = gate("real_hub_import_suite", "--stages", "execution")
    assert run.returncode == 1, run.stdout
    assert "collection-error" not in run.categories()
    [env] = run.findings("test-environment")
    assert env["severity"] == "low" and env["blocking"] is False
    assert env["location"]["path"] == HUB_TESTS
    assert env["location"]["line"] == line_of(TARGETS / "real_hub_import_suite" / HUB_TESTS, "# a package the CI lacks")
    assert env["evidence"]["data"]["environment"]["package"] == "traingate_fixture_missing_hub_package"
    assert f"--ignore={HUB_TESTS}" in env["fix"] and "pytest.importorskip('traingate_fixture_missing_hub_package')" in env["fix"]
    # pytest runs no test once a module fails to collect, so the passing test did not run either:
    # nothing was verified, and the stage fails closed.
    [no_tests] = run.findings("no-tests")
    assert no_tests["blocking"] and HUB_TESTS in no_tests["problem"] and "could not be imported here" in no_tests["problem"]
    stage = run.stage("execution")
    assert "suite incomplete: 1 test module(s) could not run here" in stage["summary"]
    assert stage["details"]["pytest"]["counts"]["environment_modules"] == 1


def test_leaving_the_module_out_lets_the_rest_of_the_suite_decide(gate, tmp_path):
    target = tmp_path / "repo"
    shutil.copytree(TARGETS / "real_hub_import_suite", target)
    config = target / "traingate.toml"
    config.write_text(config.read_text().replace('tests = ["tests"]', f'tests = ["tests", "--ignore={HUB_TESTS}"]'))
    run = gate(target, "--stages", "execution")
    assert run.returncode == 0, run.stdout
    # Leaving a module out is seen (medium, not blocking) and names the module.
    [left_out] = run.findings()
    assert left_out["category"] == "test-selection" and not left_out["blocking"], run.stdout
    assert HUB_TESTS in left_out["evidence"]["data"]["removed"]
    assert "1 passed" in run.stage("execution")["summary"]


def test_segmentation_loop_with_gradscaler_passes_and_its_item_is_the_sync(gate):
    # The shape of milesial/Pytorch-UNet's train_model: unscale_ before clipping is the right
    # protocol, and the per-step loss.item() is a real (low, non-blocking) host sync.
    target = TARGETS / "real_onehot_segmentation"
    run = gate("real_onehot_segmentation", "--stages", "performance,concurrency")
    assert run.returncode == 0, run.stdout
    assert not run.findings("gradscaler-protocol")
    item_line = line_of(target / "segment.py", "# marker: item")
    [item] = [f for f in run.findings("host-sync") if f["location"]["line"] == item_line]
    assert item["severity"] == "low" and not item["blocking"]
    assert "GradScaler protocol checked" in run.stage("concurrency")["summary"]
    # `F.one_hot(masks, n_classes)` reads the tensor back only in PyTorch's CPU range checks,
    # skipped on CUDA when the class count is given: the .item() is the only sync.
    assert {f["location"]["line"] for f in run.findings("host-sync")} == {item_line}


def test_autocast_chosen_by_device_is_not_applicable_on_a_cpu(gate):
    # The shape of karpathy/nanoGPT's train.py: `--dtype=bfloat16` on a CPU enters no autocast, on purpose.
    target = TARGETS / "real_device_gated_autocast"
    run = gate("real_device_gated_autocast", "--stages", "performance", "--device", "cpu")
    assert run.returncode == 0, run.stdout
    assert not run.findings("amp-inactive")
    note = {m["id"]: m for m in run.stage("performance")["metrics"]}["amp.active"]["note"]
    assert note.startswith("not applicable on cpu") and f"train.py:{line_of(target / 'train.py', '# marker: device gate')}" in note
    # A script's AMP setting is its arguments, not a keyword set to True.
    assert "with the script's AMP arguments (`--dtype=bfloat16`) it computed in fp32" in note and "amp_args" not in note
    assert "--device cuda" in note


def test_script_that_trains_at_import_is_called_through_its_setup(gate):
    # The shape of locuslab/TCN's adding-problem script: argparse at import, training at module
    # level. The setup sets a tiny command line with zero epochs; the gate calls train(1) once.
    run = gate("real_argv_at_import", "--stages", "execution,concurrency")
    assert run.returncode == 0, run.stdout
    assert [r["ok"] for r in run.stage("execution")["details"]["smoke"]["runs"]] == [True]
    concurrency = run.stage("concurrency")
    # 320 samples in batches of 16: the 20 steps of train(1), none from the import.
    assert concurrency["details"]["checks"]["gradscaler"]["steps"] == 20
    assert "no GradScaler used (20 optimizer step(s) observed)" in concurrency["summary"]
    assert "GradScaler protocol checked" not in concurrency["summary"]
    assert not run.findings("nondeterminism")
