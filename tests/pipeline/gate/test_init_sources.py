"""`traingate init` where the training is documented or tested: a README's command line run in
its folder after the preparation it runs first, and tests that train kept observed (no entry
point that would turn that off); what its check could not run written commented out, marked
`unverified`, and repeated by `traingate run`."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.conftest import line_of, run_gate, start_cli
from tests.entrypoint_targets import config_error, make_target
from traingate.pipeline.gate.init_propose import candidates, hint
from traingate.pipeline.gate.init_readme import documented_commands
from traingate.pipeline.gate.init_scan import scan
from traingate.pipeline.gate.initializer import propose
from traingate.pipeline.gate.verification import unverified_findings
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.schema import Category, Severity
from traingate.pipeline.model.tomlcompat import tomllib

# A toy whose README prepares its data in its folder, then trains from there; the data file is
# read by a path relative to that folder, as the README runs it.
TOY = {
    "README.md": """
        # Toy

        Train on a GPU:

        ```bash
        cd examples/toy
        python data/prepare.py --rows 64
        CUDA_VISIBLE_DEVICES=0 python train.py --epochs 30
        ```

        Or on a CPU:

        ```
        $ cd examples/toy && python train.py --epochs 30 \\
            --device cpu   # slower
        ```
        Then `python sample.py` reads the checkpoint.
    """,
    "examples/toy/data/prepare.py": """
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--rows", type=int, default=8)
        rows = parser.parse_args().rows
        torch.save((torch.randn(rows, 4), torch.randn(rows, 1)), "data/toy.pt")
    """,
    "examples/toy/train.py": """
        import argparse
        import torch

        parser = argparse.ArgumentParser()
        parser.add_argument("--epochs", type=int, default=100)
        parser.add_argument("--device", default="cuda")
        args = parser.parse_args()
        x, y = torch.load("data/toy.pt")
        model = torch.nn.Linear(4, 1).to(args.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for epoch in range(args.epochs):
            for i in range(0, len(x), 8):
                optimizer.zero_grad()
                loss = torch.nn.functional.mse_loss(model(x[i:i + 8]), y[i:i + 8])
                loss.backward()
                optimizer.step()
    """,
    "examples/toy/sample.py": "import torch\nprint(torch.load('model.pt'))\n",
}


def test_readme_commands_are_read_with_their_folder_arguments_and_preparation(tmp_path: Path):
    make_target(tmp_path, TOY)
    commands = documented_commands(tmp_path)
    assert [(c.script, c.folder, c.args, c.prepare) for c in commands] == [
        ("examples/toy/train.py", "examples/toy", ("--epochs", "30"), ("examples/toy/data/prepare.py --rows 64",)),
        ("examples/toy/train.py", "examples/toy", ("--epochs", "30", "--device", "cpu"), ("examples/toy/data/prepare.py --rows 64",)),
    ]  # the prose's inline `python sample.py` is not a command line; the environment prefix is not an argument
    assert commands[1].where == f"README.md:{line_of(tmp_path / 'README.md', '$ cd examples/toy')}"


def test_the_readmes_cpu_command_comes_first_on_a_cpu_and_its_plain_one_on_a_gpu(tmp_path: Path):
    make_target(tmp_path, TOY)
    on_cpu = candidates(scan(tmp_path), "cpu")[0]
    assert on_cpu.entrypoint == {
        "script": "examples/toy/train.py", "workdir": "examples/toy", "prepare": ["examples/toy/data/prepare.py --rows 64"],
        "args": ["--epochs", "30", "--device", "cpu"], "max_batches": 16, "max_steps": 16,
    }
    on_gpu = candidates(scan(tmp_path), "cuda")[0]
    assert on_gpu.entrypoint["args"] == ["--epochs", "30"] and on_gpu.documented == f"README.md:{line_of(tmp_path / 'README.md', 'CUDA_VISIBLE')}"


def test_workdir_and_prepare_are_checked_against_the_files(tmp_path: Path):
    make_target(tmp_path, TOY)
    assert config_error(tmp_path, 'script = "examples/toy/train.py"\nworkdir = "examples/none"\n').key.endswith("entrypoint.workdir")
    assert config_error(tmp_path, 'script = "examples/toy/train.py"\nprepare = ["examples/toy/data/missing.py"]\n').key.endswith("entrypoint.prepare[0]")
    with pytest.raises(ValueError, match="relative to the target root"):
        TargetConfig.model_validate({"entrypoint": {"script": "train.py", "prepare": ["../outside.py"]}})


@pytest.mark.slow
def test_init_verifies_the_readmes_command_in_its_folder_after_its_preparation(tmp_path: Path):
    make_target(tmp_path, TOY)
    done = start_cli(["init", str(tmp_path), "--budget", "120"], timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    config = tomllib.loads((tmp_path / "traingate.toml").read_text())
    assert "unverified" not in config and config["entrypoint"]["workdir"] == "examples/toy"
    assert "Checked: it reached 16 optimizer steps" in done.stdout and "NOT VERIFIED" not in done.stdout
    assert not (tmp_path / "examples/toy/data/toy.pt").exists()  # prepared in the check's snapshot, not in the repo


def loop_test(name: str, width: int) -> str:
    """A test training its own loop (its own step line) on a model `width` wide."""
    return f"""
        def {name}():
            torch.manual_seed(0)
            model = torch.nn.Linear({width}, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            x, y = torch.randn(32, {width}), torch.randn(32, 1)
            for _ in range(16):
                optimizer.zero_grad()
                torch.nn.functional.mse_loss(model(x), y).backward()
                optimizer.step()
    """


def trained_by_tests(root: Path, loops: int) -> Path:
    """A library whose tests (in pkg/test/, not tests/) train `loops` loops of their own, and an
    entry point a test-blind init would have configured."""
    body = "import torch\n" + "".join(textwrap.dedent(loop_test(f"test_loop_{n}", n + 2)) for n in range(loops))
    return make_target(root, {
        "pkg/__init__.py": "",
        "pkg/fit.py": "import torch\n\n\ndef fit(model, data, epochs=50):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for x, y in data:\n        torch.nn.functional.mse_loss(model(x), y).backward()\n        optimizer.step()\n",
        "pkg/test/test_loops.py": body,
    })


def test_tests_that_train_keep_the_observation_and_no_entrypoint_is_proposed(tmp_path: Path):
    trained_by_tests(tmp_path, 2)
    outcome = propose(tmp_path, device="cpu", check=False, budget_s=60)
    assert outcome.text is not None and not outcome.verified
    config = tomllib.loads(outcome.text)
    assert set(config) == {"unverified"}  # no entrypoint, no `tests`: what pytest collects (pkg/test/)
    assert "The repo's tests train: 2 test function(s)" in outcome.text
    assert "Entry points found, not configured: pkg.fit:fit (pkg/fit.py:4)." in outcome.text
    # What an unconfigured run's skipped stages say `init` would do: the same.
    assert hint(tmp_path) == "the repo's tests train: `traingate init` would keep observing them, configuring no entry point"


@pytest.mark.slow
def test_init_checks_the_tests_observation_and_widens_it_to_every_loop(tmp_path: Path):
    trained_by_tests(tmp_path, 4)
    done = start_cli(["init", str(tmp_path), "--budget", "120"], timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    text = (tmp_path / "traingate.toml").read_text()
    assert tomllib.loads(text) == {"observe_tests": 4}  # four loops, one more than the default observes
    assert "its tests step at 4 training loop(s), 3 test(s) observed" in text and "Wrote " in done.stdout  # the check observes as a run would


def test_an_unverified_configuration_is_repeated_by_the_run_as_info():
    config = TargetConfig.model_validate({"unverified": "python train.py: The check run fell short: entrypoint-crash"})
    [finding] = unverified_findings(config)
    assert (finding.category, finding.severity, finding.blocking) == (Category.UNVERIFIED_CONFIGURATION, Severity.INFO, False)
    assert "The check run fell short: entrypoint-crash" in finding.title
    assert unverified_findings(TargetConfig()) == []


@pytest.mark.slow
def test_a_check_that_crashes_leaves_the_run_unconfigured_and_the_run_says_so(tmp_path: Path):
    make_target(tmp_path, {"train.py": """
        import torch


        def train(steps=100):
            model = torch.nn.Linear(2, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(steps):
                loss = model(torch.randn(4, 2)).sum()
                loss.backward()
                optimizer.step()
                if step == 3:
                    raise RuntimeError("the data ran out")
    """})
    done = start_cli(["init", str(tmp_path), "--budget", "90"], timeout=300)
    assert done.returncode == 0 and "NOT VERIFIED" in done.stdout, done.stdout + done.stderr
    text = (tmp_path / "traingate.toml").read_text()
    assert "# The check run fell short: " in text and "the data ran out" in text
    assert f"(train.py:{line_of(tmp_path / 'train.py', 'raise RuntimeError')})" in text
    config = tomllib.loads(text)
    assert "entrypoint" not in config and "the data ran out" in config["unverified"]
    run = run_gate(tmp_path, tmp_path / "out", "--stages", "execution")
    [note] = [f for f in run.stage("configuration")["findings"] if f["category"] == "unverified-configuration"]
    assert "the data ran out" in note["title"] and run.report["decision"] == "PASS"


def test_a_readme_in_a_subfolder_may_give_the_command_as_run_from_the_root(tmp_path: Path):
    make_target(tmp_path, {"train.py": "x = 1\n", "docs/README.md": "```\n$ python train.py --fast\n```\n", "docs/tools/README": "python ../../train.py --slow\n"})
    assert [(c.readme, c.folder, c.script, c.args) for c in documented_commands(tmp_path)] == [
        ("docs/README.md", "", "train.py", ("--fast",)),
        ("docs/tools/README", "docs/tools", "train.py", ("--slow",)),  # run in its own folder, the script two up
    ]


def test_unittest_methods_that_train_are_tests_too(tmp_path: Path):
    make_target(tmp_path, {
        "lib.py": "import torch\n\n\ndef fit(model, steps=50):\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "    for _ in range(steps):\n        model(torch.randn(4, 2)).sum().backward()\n        optimizer.step()\n",
        "test/test_lib.py": "import unittest\n\nimport torch\nfrom lib import fit\n\n\nclass FitTests(unittest.TestCase):\n"
        "    def test_fit(self):\n        fit(torch.nn.Linear(2, 1))\n\n    def helper(self):\n        fit(torch.nn.Linear(2, 1))\n",
    })
    outcome = propose(tmp_path, device="cpu", check=False, budget_s=60)
    assert outcome.text is not None and "The repo's tests train: 1 test function(s) reach a training loop (test/test_lib.py:8 (FitTests.test_fit))" in outcome.text
    assert "entrypoint" not in tomllib.loads(outcome.text)
