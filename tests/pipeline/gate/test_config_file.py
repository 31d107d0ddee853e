"""Configuration: docs/contract.md section 1, and clear errors naming the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from traingate.pipeline.model.config import check_safe_name, safe_name_from
from traingate.pipeline.gate.config_file import ConfigError, load_config
from traingate.stages.correctness.config import DISTRIBUTED, DistributedConfig


def _target(tmp_path: Path, pyproject: str = "", traingate: str | None = None) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "train.py").write_text("import torch\n\ndef fit(n=1):\n    return n\n\ndef tiny():\n    return {}\n")
    if pyproject:
        (tmp_path / "pyproject.toml").write_text(pyproject)
    if traingate is not None:
        (tmp_path / "traingate.toml").write_text(traingate)
    return tmp_path


def test_no_configuration_gives_defaults(tmp_path: Path) -> None:
    config, source = load_config(_target(tmp_path))
    assert source is None and config.tests is None and "pytest collects" in config.tests_described() and config.entrypoint is None
    assert config.policy.amp_speedup_min == 1.5 and [s.value for s in config.policy.block_on] == ["critical", "high"]


def test_full_spec_example_loads(tmp_path: Path) -> None:
    root = _target(tmp_path, """
[tool.traingate]
task = "T035"
tests = ["tests", "-k", "amp"]
timeout_s = 600
[tool.traingate.entrypoint]
call = "pkg.train:fit"
setup = "pkg.train:tiny"
kwargs = { n_epochs = 2, batch_size = 4 }
amp_flag = "use_amp"
seed = 0
[tool.traingate.policy]
amp_speedup_min = 1.5
amp_memory_reduction_min = 0.40
amp_accuracy_tolerance = 0.01
block_on = ["critical", "high"]
""")
    config, source = load_config(root)
    assert source == "pyproject.toml"
    assert config.task == "T035" and config.entrypoint and config.entrypoint.kwargs == {"n_epochs": 2, "batch_size": 4}


def test_traingate_toml_wins(tmp_path: Path) -> None:
    root = _target(tmp_path, '[tool.traingate]\ntask = "A"\n', 'task = "B"\n')
    config, source = load_config(root)
    assert (config.task, source) == ("B", "traingate.toml")


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ('[tool.traingate]\ntimeuot_s = 5\n', "tool.traingate.timeuot_s", "Extra inputs"),
        ('[tool.traingate]\ntimeout_s = "soon"\n', "tool.traingate.timeout_s", "number"),
        ('[tool.traingate.policy]\nblock_on = ["severe"]\n', "tool.traingate.policy.block_on.0", "critical"),
        ('[tool.traingate.entrypoint]\ncall = "pkg.train.fit"\n', "tool.traingate.entrypoint.call", "module:function"),
        ('[tool.traingate.entrypoint]\ncall = "pkg.missing:fit"\n', "tool.traingate.entrypoint.call", "cannot import"),
        ('[tool.traingate.entrypoint]\ncall = "pkg.train:nope"\n', "tool.traingate.entrypoint.call", "defines no 'nope'"),
    ],
)
def test_bad_configuration_names_file_and_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_target(tmp_path, text))
    assert info.value.file == "pyproject.toml"
    assert info.value.key == key
    assert words in info.value.message


def test_a_script_takes_a_setup_checked_like_a_calls(tmp_path: Path) -> None:
    root = _target(tmp_path, '[tool.traingate.entrypoint]\nscript = "run.py"\nsetup = "pkg.train:tiny"\nargs = ["--steps", "2"]\n')
    (root / "run.py").write_text("print('training')\n")
    config, _ = load_config(root)
    assert config.entrypoint is not None and config.entrypoint.setup == "pkg.train:tiny"
    assert config.entrypoint.label == "python run.py --steps 2"


@pytest.mark.parametrize(
    ("setup", "words"),
    [
        ("pkg.train", "module:function"),
        ("pkg.train:Trainer.make", "module:function"),
        ("pkg.missing:tiny", "cannot import 'pkg.missing'"),
        ("pkg.train:prepare", "defines no 'prepare'"),
    ],
)
def test_a_scripts_bad_setup_names_the_setup_key(tmp_path: Path, setup: str, words: str) -> None:
    root = _target(tmp_path, f'[tool.traingate.entrypoint]\nscript = "run.py"\nsetup = "{setup}"\n')
    (root / "run.py").write_text("print('training')\n")
    with pytest.raises(ConfigError) as info:
        load_config(root)
    assert info.value.key == "tool.traingate.entrypoint.setup"
    assert words in info.value.message


def test_invalid_toml_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_target(tmp_path, traingate="task = \n"))
    assert info.value.file == "traingate.toml"


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("tool = 5\n", "tool", "must be a table"),
        ('[tool]\ntraingate = "x"\n', "tool.traingate", "must be a table"),
        ("[tool.traingate]\ntimeout_s = inf\n", "tool.traingate.timeout_s", "finite"),
        ("[tool.traingate]\ntimeout_s = nan\n", "tool.traingate.timeout_s", "finite"),
        ("[tool.traingate]\ntimeout_s = 1e300\n", "tool.traingate.timeout_s", "less than or equal"),
        ("[tool.traingate.policy]\namp_accuracy_tolerance = -inf\n", "tool.traingate.policy.amp_accuracy_tolerance", "finite"),
        ('[tool.traingate]\ntask = "../.."\n', "tool.traingate.task", "not a valid name"),
        ('[tool.traingate]\ntask = ".hidden"\n', "tool.traingate.task", "not a valid name"),
        ('[tool.traingate]\ntask = "a/b"\n', "tool.traingate.task", "not a valid name"),
    ],
)
def test_input_that_would_crash_or_escape_is_a_config_error(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_target(tmp_path, text))
    assert (info.value.file, info.value.key) == ("pyproject.toml", key)
    assert words in info.value.message and "Value error" not in info.value.message


@pytest.mark.parametrize("name", ["T035", "v7-fixed", "a.b_c", "f0ac19b"])
def test_ordinary_task_names_are_accepted(name: str) -> None:
    assert check_safe_name(name) == name


@pytest.mark.parametrize("name", ["", ".", "..", "../x", "a/b", ".git", "-rf", "a b", "x\\y"])
def test_names_that_are_not_one_folder_are_refused(name: str) -> None:
    with pytest.raises(ValueError):
        check_safe_name(name)


def test_a_default_task_from_an_odd_folder_name_is_made_safe() -> None:
    assert check_safe_name(safe_name_from("my repo (copy)")) == "my_repo__copy_"
    assert safe_name_from("..") == "target"


def test_distributed_section_in_pyproject_and_in_traingate_toml(tmp_path: Path) -> None:
    for name in "abc":
        (tmp_path / name).mkdir()
    # The correctness stage's section under a key of its own, read as it always was.
    config, _ = load_config(_target(tmp_path / "a", "[tool.traingate.distributed]\nnproc = 2\n"))
    distributed = config.optional_section(DISTRIBUTED, DistributedConfig)
    assert distributed is not None and (distributed.nproc, distributed.timeout_s) == (2, 120)
    config, source = load_config(_target(tmp_path / "b", traingate="timeout_s = 90\n\n[distributed]\nnproc = 4\ntimeout_s = 30\n"))
    distributed = config.optional_section(DISTRIBUTED, DistributedConfig)
    assert source == "traingate.toml" and distributed is not None and (distributed.nproc, distributed.timeout_s) == (4, 30)
    assert load_config(_target(tmp_path / "c"))[0].optional_section(DISTRIBUTED, DistributedConfig) is None


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[tool.traingate.distributed]\nnproc = 1\n", "tool.traingate.distributed.nproc", "greater than or equal to 2"),
        ("[tool.traingate.distributed]\nnproc = 9\n", "tool.traingate.distributed.nproc", "less than or equal to 8"),
        ("[tool.traingate.distributed]\ntimeout_s = 30\n", "tool.traingate.distributed.nproc", "Field required"),
        ("[tool.traingate.distributed]\nnproc = 2\nranks = 2\n", "tool.traingate.distributed.ranks", "Extra inputs"),
        ("[tool.traingate.distributed]\nnproc = 2\ntimeout_s = 0\n", "tool.traingate.distributed.timeout_s", "greater than 0"),
        ("[tool.traingate]\ntimeout_s = 60\n\n[tool.traingate.distributed]\nnproc = 2\n", "tool.traingate", "must be below timeout_s"),
    ],
)
def test_bad_distributed_configuration_names_the_key(tmp_path: Path, text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(_target(tmp_path, text))
    assert (info.value.file, info.value.key) == ("pyproject.toml", key)
    assert words in info.value.message
