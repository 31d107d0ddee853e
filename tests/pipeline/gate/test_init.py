"""`traingate init`: training entry points found by reading the files, the tiny configuration
proposed for each, what it cannot decide written as commented keys, the check run under the
probes, and the file it writes (never the repo's code)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import TARGETS, cli_in_process, line_of, run_gate, start_cli
from tests.entrypoint_targets import make_target
from traingate.pipeline.gate.init_propose import candidates, hint
from traingate.pipeline.gate.init_scan import scan
from traingate.pipeline.gate.initializer import propose
from traingate.pipeline.gate.init_toml import enabled
from traingate.pipeline.model.tomlcompat import tomllib

LOOP = ["for x, y in loader:", "    loss = nn.functional.mse_loss(model(x), y)", "    optimizer.zero_grad()", "    loss.backward()", "    optimizer.step()"]


def loop(indent: int) -> str:
    """The training loop's lines at `indent` columns, for a file written without dedent."""
    return "".join(" " * indent + line + "\n" for line in LOOP)


def write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def best(root: Path):
    [first, *_] = candidates(scan(root))
    return first


def written(root: Path) -> tuple[dict, str]:
    """The proposal as its user enables it: the lines init wrote commented out (it could not run
    them) uncommented, its FILL IN lines left as they are."""
    outcome = propose(root, device="cpu", check=False, budget_s=60)
    assert outcome.text is not None
    return tomllib.loads(enabled(outcome.text)), outcome.text


def test_a_script_whose_main_reaches_the_loop_is_configured_with_tiny_options_and_the_step_budget(tmp_path: Path):
    write(tmp_path, {
        "train.py": "import argparse\nimport torch\nfrom torch import nn\n\n\ndef fit(model, optimizer, loader):\n" + loop(4) + """

def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--fp16", action="store_true")
    args = parser.parse_args()
    fit(None, None, [])


if __name__ == "__main__":
    main()
""",
    })
    config, text = written(tmp_path)
    assert config["entrypoint"] == {
        "script": "train.py", "args": ["--epochs", "2", "--batch-size", "8"], "amp_args": {"on": ["--fp16"], "off": []},
        "max_batches": 16, "max_steps": 16,
    }
    assert config["tests"] is False  # no test files
    chosen = best(tmp_path)
    assert (chosen.kind, chosen.line) == ("script", line_of(tmp_path / "train.py", 'if __name__ == "__main__":'))
    assert "its `__main__` block runs main, which trains" in text


def test_a_required_option_is_a_commented_fill_in_inside_args_and_the_file_stays_valid(tmp_path: Path):
    make_target(tmp_path, {
        "train.py": """
            import argparse
            import torch


            def main():
                parser = argparse.ArgumentParser()
                parser.add_argument("--data-dir", required=True)
                parser.add_argument("--steps", type=int, default=5000)
                args = parser.parse_args()
                loss = torch.zeros(1, requires_grad=True).sum()
                loss.backward()
                torch.optim.SGD([torch.zeros(1)], lr=0.1).step()


            if __name__ == "__main__":
                main()
        """,
        "tests/test_nothing.py": "def test_nothing():\n    pass\n",
    })
    outcome = propose(tmp_path, device="cpu", check=False, budget_s=60)
    assert outcome.text is not None
    # It cannot run as written: commented out, so that `traingate run` runs as unconfigured, and marked.
    as_written = tomllib.loads(outcome.text)
    assert "entrypoint" not in as_written and as_written["unverified"] == "python train.py was not checked: its FILL IN values are missing"
    config = tomllib.loads(enabled(outcome.text))
    assert config["entrypoint"]["args"] == ["--steps", "16"]
    assert "tests" not in config  # the tests folder: the default
    assert '# "--data-dir", "FILL IN",   # --data-dir: required, no default (line 8)' in outcome.text
    assert any("--data-dir in `args`: the script requires it and has no default (train.py:8)" in m for m in outcome.messages)
    assert "Not checked: the FILL IN lines must be filled first." in outcome.text
    # What it says it runs is a claim read from the files, and says so: no check observed it.
    assert "# Proposed training entry point, NOT VERIFIED: python train.py (train.py:" in outcome.text


def test_a_functions_parameters_give_its_kwargs_its_amp_flag_and_what_to_fill_in(tmp_path: Path):
    make_target(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/loop.py": "from torch import nn\n\n\ndef train(model, loader, optimizer, epochs=50, batch_size=128, use_amp=False, log_every=10):\n" + loop(4),
    })
    config, text = written(tmp_path)
    assert config["entrypoint"]["call"] == "pkg.loop:train"
    assert config["entrypoint"]["amp_flag"] == "use_amp"
    assert config["entrypoint"]["kwargs"] == {"epochs": 2, "batch_size": 8}
    for name in ("model", "loader", "optimizer"):
        assert f'# {name} = "FILL IN"   # required, no default' in text
    assert "log_every" not in text


def test_a_method_on_a_class_built_with_its_defaults_needs_no_setup_module(tmp_path: Path):
    write(tmp_path, {
        "trainer.py": "from torch import nn\n\n\nclass Trainer:\n    def __init__(self, lr=0.1, epochs=3):\n        self.lr = lr\n\n"
        "    def fit(self, epochs=100):\n        model = optimizer = loader = None\n" + loop(8),
    })
    config, _ = written(tmp_path)
    assert config["entrypoint"]["call"] == "trainer:Trainer.fit"
    assert config["entrypoint"]["setup"] == "trainer:Trainer"  # the class builds the instance
    assert config["entrypoint"]["kwargs"] == {"epochs": 2}


def test_a_method_whose_class_needs_arguments_asks_for_a_setup(tmp_path: Path):
    write(tmp_path, {
        "trainer.py": "from torch import nn\n\n\nclass Trainer(nn.Module):\n    def __init__(self, model, data_root):\n        super().__init__()\n\n"
        "    def fit(self):\n        model = optimizer = loader = None\n" + loop(8),
    })
    outcome = propose(tmp_path, device="cpu", check=False, budget_s=60)
    assert outcome.text is not None and "setup" not in tomllib.loads(enabled(outcome.text))["entrypoint"]
    assert '# setup = "traingate_setup:build"   # FILL IN: a function (in a module of yours) returning the Trainer instance' in outcome.text
    assert any("Trainer() requires model, data_root" in m for m in outcome.messages)
    # Enabled as written, the run would stop at a configuration error naming the key to fill in.
    assert any("is a method: give `setup`" in m for m in outcome.messages)


@pytest.mark.parametrize(("body", "how"), [
    ("accelerator.backward(loss)\n    optimizer.step()", "calls backward() and an optimizer's step()"),
    ("scaler.scale(loss).backward()\n    scaler.step(optimizer)", "calls backward() and an optimizer's step()"),
    ("trainer = Trainer(model=model, args=args)\n    trainer.train()", "calls a trainer's train()"),
    ("trainer = pl.Trainer(max_epochs=3)\n    trainer.fit(model, datamodule=dm)", "calls a trainer's fit()"),
])
def test_the_framework_loops_are_found(tmp_path: Path, body: str, how: str):
    make_target(tmp_path, {"run.py": f"def go(model=None, args=None, dm=None):\n    loss = accelerator = scaler = optimizer = None\n    {body}\n"})
    chosen = best(tmp_path)
    assert (chosen.label, chosen.why) == ("run:go", f"go {how}")


def test_a_scheduler_step_alone_is_not_training(tmp_path: Path):
    make_target(tmp_path, {"run.py": "def go(loss, scheduler, lr_sched):\n    loss.backward()\n    scheduler.step()\n    lr_sched.step()\n"})
    assert candidates(scan(tmp_path)) == []


def test_a_lightning_module_with_no_trainer_run_proposes_the_frameworks_fit(tmp_path: Path):
    make_target(tmp_path, {
        "model.py": """
            import lightning.pytorch as pl


            class Net(pl.LightningModule):
                def training_step(self, batch, batch_idx):
                    return self(batch).sum()
        """,
    })
    outcome = propose(tmp_path, device="cpu", check=False, budget_s=60)
    assert outcome.text is not None
    assert tomllib.loads(enabled(outcome.text))["entrypoint"]["call"] == "lightning.pytorch:Trainer.fit"
    assert '"model": Net(...), "train_dataloaders": ...}' in outcome.text


def test_a_test_that_trains_is_a_candidate_and_its_conftest_is_noted(tmp_path: Path):
    make_target(tmp_path, {
        "lib.py": "def fit(model, optimizer, loader):\n" + loop(4),
        "tests/conftest.py": "",
        "tests/test_fit.py": "from lib import fit\n\n\ndef test_fit_one_epoch():\n    fit(None, None, [])\n",
    })
    listed = candidates(scan(tmp_path))
    test = next(c for c in listed if c.kind == "test")
    assert test.label == "tests.test_fit:test_fit_one_epoch" and test.runnable
    assert "called as a function, it runs without pytest's fixtures and conftest.py" in test.notes


def test_downloads_are_noted(tmp_path: Path):
    make_target(tmp_path, {
        "train.py": "import torchvision\n\n\ndef train(model=None, optimizer=None, loader=None):\n"
        "    data = torchvision.datasets.MNIST('data', download=True)\n" + loop(4),
    })
    assert best(tmp_path).notes == ["it may download data: torchvision.datasets.MNIST(...) at train.py:5"]


def test_no_training_found_says_so_and_the_unconfigured_hint_is_none(tmp_path: Path):
    make_target(tmp_path, {"util.py": "def add(a, b):\n    return a + b\n"})
    outcome = propose(tmp_path, device="cpu", check=False, budget_s=60)
    assert outcome.text is None and outcome.messages[0].startswith("No training entry point found in 1 Python file(s)")
    assert hint(tmp_path) is None


def test_the_hint_names_the_candidate(tmp_path: Path):
    make_target(tmp_path, {"train.py": "import torch\nloss = torch.ones(1, requires_grad=True).sum()\nloss.backward()\noptimizer.step()\n"})
    # No `__main__` block: the script is located at its first module-level call.
    assert hint(tmp_path) == "`traingate init` would configure python train.py (train.py:2)"


# -- end to end: the command -----------------------------------------------------------------


def tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def initialised(tmp_path_factory: pytest.TempPathFactory):
    """The long-defaults script of entry_budget with no configuration: `traingate init`, then `traingate run`."""
    root = tmp_path_factory.mktemp("repo")
    (root / "train.py").write_bytes((TARGETS / "entry_budget" / "train.py").read_bytes())
    before = tree_digest(root)
    done = start_cli(["init", str(root), "--budget", "120"], timeout=400)
    after = tree_digest(root)
    run = run_gate(root, tmp_path_factory.mktemp("out") / "out", "--stages", "execution,correctness", timeout=400) if done.returncode == 0 else None
    return root, done, before, after, run


@pytest.mark.slow
def test_init_writes_a_checked_configuration_and_changes_nothing_else(initialised):
    root, done, before, after, _ = initialised
    assert done.returncode == 0, done.stdout + done.stderr
    assert set(after) - set(before) == {"traingate.toml"} and {k: after[k] for k in before} == before
    text = (root / "traingate.toml").read_text()
    assert "# Checked: it reached 16 optimizer steps in" in text
    assert tomllib.loads(text)["entrypoint"] == {"script": "train.py", "args": ["--epochs", "2", "--batch-size", "8"], "max_batches": 16, "max_steps": 16}
    assert "Checked: it reached 16 optimizer steps" in done.stdout and "Wrote " in done.stdout


@pytest.mark.slow
def test_the_written_configuration_runs_the_gate_with_every_step_observed(initialised):
    _, _, _, _, run = initialised
    assert run is not None and (run.returncode, run.report["decision"]) == (0, "PASS"), run and run.stdout
    assert {m["id"]: m["value"] for m in run.stage("correctness")["metrics"]}["steps.observed"] == 16
    [smoke_run] = run.stage("execution")["details"]["smoke"]["runs"]
    assert smoke_run["budget_stop"].startswith("stopped by the step budget after 16 optimizer steps")


def test_an_existing_configuration_is_kept_unless_forced_and_dry_run_prints(tmp_path: Path):
    make_target(tmp_path, {"train.py": "import torch\nloss = torch.ones(1, requires_grad=True).sum()\nloss.backward()\noptimizer.step()\n", "traingate.toml": "tests = false\n"})
    # --no-check runs nothing of the target's: the command runs in this process.
    refused = cli_in_process("init", str(tmp_path), "--no-check")
    assert refused.returncode == 2 and "traingate.toml already configures traingate" in refused.stderr
    printed = cli_in_process("init", str(tmp_path), "--no-check", "--dry-run")
    assert printed.returncode == 0 and 'script = "train.py"' in printed.stdout
    assert (tmp_path / "traingate.toml").read_text() == "tests = false\n"


@pytest.mark.slow
def test_an_unconfigured_run_names_init_and_its_candidate(tmp_path: Path):
    make_target(tmp_path, {"train.py": (TARGETS / "entry_budget" / "train.py").read_text(), "tests/test_ok.py": "def test_ok():\n    pass\n"})
    run = run_gate(tmp_path, tmp_path / "out", "--stages", "execution,correctness")
    main_line = line_of(tmp_path / "train.py", 'if __name__ == "__main__":')
    expected = f"`traingate init` would configure python train.py (train.py:{main_line})"
    assert expected in run.stage("correctness")["skipped_reason"]
    assert expected in run.stdout
    assert expected in json.dumps(run.report["stages_not_run"])


def test_a_script_that_asks_for_cuda_by_default_is_kept_on_the_cpu_and_says_so(tmp_path: Path):
    write(tmp_path, {
        "add.py": "import argparse\nimport torch\nfrom torch import nn\n\nparser = argparse.ArgumentParser()\n"
        "parser.add_argument('--cuda', action='store_false')\nparser.add_argument('--device', default='cuda:0')\n"
        "args = parser.parse_args()\n\n\ndef train(model=None, optimizer=None, loader=()):\n" + loop(4) + "\n\nfor epoch in range(3):\n    train()\n",
    })
    chosen = best(tmp_path)
    assert chosen.why == "its module-level code runs train, which trains"
    assert chosen.entrypoint["args"] == ["--cuda", "--device", "cpu"]
    assert any(note.startswith("`--cuda` keeps it on the CPU") for note in chosen.notes)
    on_gpu = candidates(scan(tmp_path), "cuda")[0]
    assert on_gpu.entrypoint["args"] == [] and on_gpu.notes == []
