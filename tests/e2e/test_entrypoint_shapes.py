"""Entrypoints in the shapes repos have: a script run as `__main__`, a method on the object
`setup` builds (setup running before the entrypoint's module is imported), and the
configuration checks, crash locations and test coverage that go with each."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TARGETS, line_of
from traingate.pipeline.gate.config_file import load_config
from traingate.stages.execution.coverage import entrypoint_source
from traingate.pipeline.supervision.warm_pool import WarmPool
from tests.entrypoint_targets import config_error, make_target, smoke


# -- end to end: the fixture targets ---------------------------------------------------------


def test_a_training_script_passes_every_stage(gate):
    run = gate("entry_script")
    assert (run.returncode, run.report["decision"]) == (0, "PASS"), run.stdout
    assert {s["name"]: s["status"] for s in run.report["stages"]} == {"execution": "passed", "performance": "passed", "concurrency": "passed", "correctness": "passed"}
    assert run.findings() == []
    smoke_details = run.stage("execution")["details"]["smoke"]
    assert smoke_details["script"] == "train.py" and smoke_details["runs"][0]["ok"] is True
    # The optimizer hooks see every step of the script's loop (`--steps 24` in its args), in
    # the profiled run and in the concurrency stage's observed run.
    assert {m["id"]: m["value"] for m in run.stage("performance")["metrics"]}["steps.profiled"] == 24
    assert {m["id"]: m["value"] for m in run.stage("concurrency")["metrics"]}["steps.observed"] == 24
    # The suite runs the script in its own process (runpy), so the script's code counts as tested.
    assert run.stage("execution")["details"]["coverage"]["executed_statements"] > 0
    # One interpreter imported torch for the runs of every stage (the agents' host, handing each
    # agent a fork of its own): only the concurrency stage's other hash seed started another, and
    # the execution stage's unwatched smoke call, whose start-up environment holds none of the
    # gate's settings.
    started = sorted(p.parent.name for p in (run.out / "work").glob("*/warm-*.stdout"))
    assert started == ["agents", "concurrency", "execution"]


def test_a_script_that_raises_is_located_at_its_line(gate):
    run = gate("entry_script_crash", "--stages", "execution")
    assert (run.returncode, run.report["decision"]) == (1, "BLOCK")
    [crash] = run.findings("entrypoint-crash")
    script = TARGETS / "entry_script_crash" / "train.py"
    assert crash["location"]["path"] == "train.py"
    assert crash["location"]["line"] == line_of(script, 'batch["targets"]')
    assert crash["blocking"] is True
    # Importing the script in a test runs none of its training code.
    [untested] = run.findings("entrypoint-untested")
    assert untested["location"]["path"] == "train.py" and untested["blocking"] is False


def test_a_scripts_setup_prepares_its_git_ignored_data_before_it_runs(gate, tmp_path: Path, warm_pool: WarmPool | None):
    # train.py reads data/train.bin, which only the setup writes: the smoke call passes only if
    # the setup ran first, in the target root.
    run = gate("entry_script_setup", "--stages", "execution")
    assert (run.returncode, run.report["decision"]) == (0, "PASS"), run.stdout
    # `tests = false` is said as an info `no-tests`; nothing else is found.
    assert [(f["category"], f["severity"]) for f in run.findings()] == [("no-tests", "info")]
    smoke_details = run.stage("execution")["details"]["smoke"]
    assert smoke_details["script"] == "train.py" and smoke_details["runs"][0]["ok"] is True
    # The control: the same target without its setup crashes where the script reads the data.
    bare = tmp_path / "bare"
    shutil.copytree(TARGETS / "entry_script_setup", bare, ignore=shutil.ignore_patterns("data"))
    toml = bare / "traingate.toml"
    toml.write_text("\n".join(line for line in toml.read_text().splitlines() if not line.startswith("setup")))
    [crash] = smoke(bare, warm_pool).findings
    assert crash.category.value == "entrypoint-crash" and "FileNotFoundError" in crash.title
    assert (crash.location.path, crash.location.line) == ("train.py", line_of(bare / "train.py", 'read_bytes()'))


def test_a_trainer_method_passes_every_stage_with_setup_before_import(gate):
    # trainlib.trainer reads TRAINLIB_DEVICE when imported and only the setup sets it: the
    # run passes only if setup runs before the entrypoint's module is imported.
    run = gate("entry_trainer")
    assert (run.returncode, run.report["decision"]) == (0, "PASS"), run.stdout
    assert run.findings() == []
    assert run.stage("execution")["details"]["coverage"]["function"] == "Trainer.fit"


# -- the harness: scripts --------------------------------------------------------------------


def test_a_script_exit_zero_is_a_normal_return_and_a_non_zero_exit_is_located(tmp_path: Path, warm_pool: WarmPool | None):
    clean = make_target(tmp_path / "clean", {
        "traingate.toml": '[entrypoint]\nscript = "scripts/run.py"\nargs = ["--name", "x"]\n',
        "scripts/run.py": """
            import os, sys
            from helper import greet  # the script's own folder comes first on sys.path
            assert sys.argv[1:] == ["--name", "x"], sys.argv
            assert os.getcwd() == os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
            greet()
            sys.exit(0)
        """,
        "scripts/helper.py": "def greet():\n    print('hello')\n",
    })
    result = smoke(clean, warm_pool)
    assert result.findings == [] and result.runs[0][2].ok

    failing = make_target(tmp_path / "failing", {
        "traingate.toml": '[entrypoint]\nscript = "train.py"\n',
        "train.py": """
            import sys

            def main():
                return 3

            if __name__ == "__main__":
                sys.exit(main())
        """,
    })
    [crash] = smoke(failing, warm_pool).findings
    assert crash.category.value == "entrypoint-crash"
    assert (crash.location.path, crash.location.line) == ("train.py", line_of(failing / "train.py", "sys.exit(main())"))


def test_a_script_that_cannot_parse_its_arguments_is_located_at_parse_args(tmp_path: Path, warm_pool: WarmPool | None):
    root = make_target(tmp_path, {
        "traingate.toml": '[entrypoint]\nscript = "train.py"\nargs = ["--epochs", "two"]\n',
        "train.py": """
            import argparse
            parser = argparse.ArgumentParser()
            parser.add_argument("--epochs", type=int)
            args = parser.parse_args()
        """,
    })
    [crash] = smoke(root, warm_pool).findings
    assert (crash.location.path, crash.location.line) == ("train.py", line_of(root / "train.py", "parse_args()"))
    # Never the harness or runpy: only the target's own frames become locations.
    assert "traingate" not in crash.location.path and "runpy" not in crash.location.path


def test_what_a_script_defines_stays_picklable_after_it_ran(tmp_path: Path):
    # The DataLoader start-method probe pickles the script's Dataset after the call returned.
    script = make_target(tmp_path, {"train.py": "import sys\nclass Data:\n    pass\nsys.exit(0)\n"}) / "train.py"
    code = (
        "import pickle, sys\nfrom pathlib import Path\n"
        "from traingate.stages.harness.entrypoint import run_script\n"
        f"run_script(Path({str(script)!r}), [])\n"
        "import __main__\nprint(len(pickle.dumps(__main__.Data())) > 0)\n"
    )
    done = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.stdout.strip() == "True", done.stderr


# -- the harness: setup and methods ---------------------------------------------------------


def test_a_scripts_setup_runs_first_in_the_target_root_and_its_return_value_is_unused(tmp_path: Path, warm_pool: WarmPool | None):
    root = make_target(tmp_path, {
        "traingate.toml": '[entrypoint]\nscript = "scripts/run.py"\nsetup = "prepare:env"\nargs = ["--fast"]\n',
        "prepare.py": """
            import os

            def env():
                os.environ["RUN_MODE"] = "tiny"
                open("marker.txt", "w").write(os.getcwd())
                return {"args": ["--slow"]}  # not used: the script's command line is `args`
        """,
        "scripts/run.py": """
            import os, sys
            assert os.environ["RUN_MODE"] == "tiny"
            assert open("marker.txt").read() == os.getcwd()
            assert sys.argv[1:] == ["--fast"], sys.argv
        """,
    })
    result = smoke(root, warm_pool)
    assert result.findings == [] and result.runs[0][2].ok
    assert (root / "marker.txt").read_text() == str(root.resolve())


def test_a_scripts_setup_that_raises_is_a_setup_crash_at_its_line(tmp_path: Path, warm_pool: WarmPool | None):
    root = make_target(tmp_path, {
        "traingate.toml": '[entrypoint]\nscript = "train.py"\nsetup = "prepare:download"\n',
        "prepare.py": """
            def download():
                raise ConnectionError("no route to the dataset host")  # the setup's failing line
        """,
        "train.py": "open('ran.txt', 'w').write('the script ran')\n",
    })
    [crash] = smoke(root, warm_pool).findings
    assert crash.category.value == "entrypoint-crash" and crash.evidence.data["phase"] == "setup"
    assert (crash.location.path, crash.location.line) == ("prepare.py", line_of(root / "prepare.py", "the setup's failing line"))
    assert "running its setup" in crash.problem
    assert not (root / "ran.txt").exists()  # the script never ran after its setup failed


def test_setup_runs_before_the_entrypoints_module_is_imported(tmp_path: Path, warm_pool: WarmPool | None):
    root = make_target(tmp_path, {
        "traingate.toml": '[entrypoint]\ncall = "job:run"\nsetup = "prepare:env"\n',
        "prepare.py": "import os\n\ndef env():\n    os.environ['JOB_MODE'] = 'tiny'\n    return {'scale': 2}\n",
        "job.py": "import os\nMODE = os.environ['JOB_MODE']\n\ndef run(scale):\n    return f'{MODE}-{scale}'\n",
    })
    result = smoke(root, warm_pool)
    assert result.findings == []
    assert result.runs[0][2].result["returned"] == "tiny-2"


def test_a_method_gets_the_instance_and_kwargs_from_a_setup_dict(tmp_path: Path, warm_pool: WarmPool | None):
    root = make_target(tmp_path, {
        "traingate.toml": '[entrypoint]\ncall = "fit:Trainer.fit"\nsetup = "fit:build"\nkwargs = { epochs = 3 }\n',
        "fit.py": """
            class Other:
                def fit(self):
                    raise AssertionError("the wrong class's fit")

            class Trainer:
                def __init__(self, base):
                    self.base = base

                def fit(self, epochs, verbose=False):
                    return self.base + epochs + (100 if verbose else 0)

            def build():
                return {"self": Trainer(10), "verbose": True}
        """,
    })
    result = smoke(root, warm_pool)
    assert result.findings == []
    assert result.runs[0][2].result["returned"] == 113
    source = entrypoint_source(root, "fit:Trainer.fit")
    assert source is not None and source.def_line == line_of(root / "fit.py", "def fit(self, epochs")


def test_a_setup_returning_the_wrong_object_is_a_setup_crash_not_located_in_the_harness(tmp_path: Path, warm_pool: WarmPool | None):
    root = make_target(tmp_path, {
        "traingate.toml": '[entrypoint]\ncall = "fit:Trainer.fit"\nsetup = "fit:build"\n',
        "fit.py": "class Trainer:\n    def fit(self):\n        return 1\n\ndef build():\n    return object()\n",
    })
    [crash] = smoke(root, warm_pool).findings
    assert crash.evidence.data["phase"] == "setup"
    assert "not an instance of Trainer" in crash.problem
    # No frame of the target raised: the finding points at the entrypoint, not at traingate's code.
    assert (crash.location.path, crash.location.line) == ("fit.py", 2)


# -- configuration --------------------------------------------------------------------------


def test_exactly_one_of_call_and_script(tmp_path: Path):
    error = config_error(tmp_path / "both", 'call = "t:f"\nscript = "t.py"\n', {"t.py": "def f():\n    pass\n"})
    assert error.key == "traingate.entrypoint" and "exactly one of `call`" in error.message
    error = config_error(tmp_path / "none", "seed = 1\n")
    assert "exactly one of `call`" in error.message


@pytest.mark.parametrize(
    ("entrypoint", "key", "says"),
    [
        ('script = "missing.py"\n', "traingate.entrypoint.script", "no file 'missing.py'"),
        ('script = "../outside.py"\n', "traingate.entrypoint.script", "relative to the target root"),
        ('script = "train.py"\namp_flag = "use_amp"\n', "traingate.entrypoint", "`amp_flag` applies only to `call`"),
        ('script = "train.py"\nkwargs = { steps = 2 }\n', "traingate.entrypoint", "`kwargs` applies only to `call`"),
        ('call = "train:Trainer.fit"\nargs = ["--x"]\n', "traingate.entrypoint", "`args` applies only to `script`"),
        ('call = "train:Trainer.fit"\n', "traingate.entrypoint.call", "give `setup`"),
        ('call = "train:Trainer.run"\nsetup = "train:make"\n', "traingate.entrypoint.call", "class Trainer defines no 'run'"),
        ('call = "train:make.fit"\nsetup = "train:make"\n', "traingate.entrypoint.call", "train.py: make is not a class"),
    ],
)
def test_entrypoint_configuration_errors_name_the_key(tmp_path: Path, entrypoint: str, key: str, says: str):
    files = {"train.py": "class Trainer:\n    def fit(self):\n        pass\n\ndef make():\n    return Trainer()\n"}
    error = config_error(tmp_path, entrypoint, files)
    assert error.key == key and says in error.message, str(error)


def test_static_methods_and_inherited_methods_need_no_static_proof(tmp_path: Path):
    make_target(tmp_path, {
        "traingate.toml": '[entrypoint]\ncall = "train:Loop.run"\n',
        "train.py": "class Loop:\n    @staticmethod\n    def run():\n        return 1\n",
    })
    config, _ = load_config(tmp_path)
    assert config.entrypoint is not None and config.entrypoint.call == "train:Loop.run"
    (tmp_path / "traingate.toml").write_text('[entrypoint]\ncall = "train:Child.fit"\nsetup = "train:make"\n')
    (tmp_path / "train.py").write_text("from base import Base\nclass Child(Base):\n    pass\ndef make():\n    return Child()\n")
    assert load_config(tmp_path)[0].entrypoint is not None


# -- what `entrypoint-untested` counts for a script ------------------------------------------


def test_a_scripts_counted_code_excludes_what_importing_it_runs(tmp_path: Path):
    script = make_target(tmp_path, {
        "train.py": '''
            """Docstring."""
            import torch
            from torch import nn

            LR = 0.1


            class Model(nn.Module):
                scale = 2

                def forward(self, x):
                    return x * self.scale


            def main():
                return Model()(torch.ones(1))


            if __name__ == "__main__":
                main()
        ''',
    }) / "train.py"
    source = entrypoint_source(tmp_path, load_config_for_script(tmp_path, "train.py"))
    assert source is not None and source.script
    counted = {line_of(script, text) for text in ("LR = 0.1", "return x * self.scale", "return Model()(torch", "    main()")}
    assert source.statements == counted
    assert source.first_line == line_of(script, "LR = 0.1")


def load_config_for_script(root: Path, script: str):
    (root / "traingate.toml").write_text(f'[entrypoint]\nscript = "{script}"\n')
    config, _ = load_config(root)
    assert config.entrypoint is not None
    return config.entrypoint
