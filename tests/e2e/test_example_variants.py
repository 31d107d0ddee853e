"""The bundled example target and its versions behave as their README says.

Each version is materialized once per module into a temporary folder; its entrypoint and
its own test suite run in child processes there (the example's code never runs in the
test process). v7 must crash with KeyError 'train_data' at the print that reads it, v7-fixed
and v6 must train; the v7 suite must be green while never calling the entrypoint.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from tests.paths import REPO

MATERIALIZE = REPO / "examples" / "materialize.py"
ENTRYPOINT_FILE = Path("utils") / "tier3_training_utilities.py"
CRASH_STATEMENT = "print(f\"Training samples: {len(env['train_data'])}\")"
VERSIONS = ("v7", "v7-fixed", "v6")
MIN_OPTIMIZER_STEPS = 20

# Run the configured entrypoint call in each materialized tree and print one JSON line per
# tree: torch is imported once, and each call runs in a fork of its own, in its tree's folder,
# importing that tree's modules afresh.
DRIVER = """
import json, os, sys, traceback
import torch
for version, tree, kwargs in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid:
        os.waitpid(pid, 0)
        continue
    os.chdir(tree)
    sys.path.insert(0, tree)
    try:
        from utils.tier3_training_utilities import test_fine_tuning
        result = test_fine_tuning(**kwargs)
        out = {"ok": True, "loss_history": result["loss_history"], "final_loss": result["final_loss"],
               "n_steps": result["n_steps"]}
    except Exception as exc:
        frame = traceback.extract_tb(exc.__traceback__)[-1]
        out = {"ok": False, "type": type(exc).__name__, "args": [str(a) for a in exc.args],
               "file": frame.filename, "line": frame.lineno, "text": frame.line}
    print("RESULT " + version + " " + json.dumps(out), flush=True)
    os._exit(0)
"""


def _load_materialize() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_materialize", MATERIALIZE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    materialize = _load_materialize()
    root = tmp_path_factory.mktemp("example-versions")
    return {version: materialize.materialize(version, root / version) for version in VERSIONS}


def _entrypoint_config(tree: Path) -> dict:
    config = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["traingate"]["entrypoint"]
    assert config["call"] == "utils.tier3_training_utilities:test_fine_tuning"
    return config


@pytest.fixture(scope="module")
def outcomes(trees: dict[str, Path]) -> dict[str, dict]:
    """Each version's configured entrypoint call, AMP off, run once for the module's tests."""
    calls = []
    for version, tree in trees.items():
        config = _entrypoint_config(tree)
        calls.append((version, str(tree), {**config["kwargs"], config["amp_flag"]: False}))
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, json.dumps(calls)],
        env=_child_env(), capture_output=True, text=True, timeout=300,
    )
    found = dict(line.removeprefix("RESULT ").split(" ", 1) for line in done.stdout.splitlines() if line.startswith("RESULT "))
    assert done.returncode == 0 and set(found) == set(trees), done.stdout[-2000:] + done.stderr[-2000:]
    return {version: json.loads(text) for version, text in found.items()}


def _line_of(path: Path, statement: str) -> int:
    matches = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip() == statement]
    assert len(matches) == 1, f"{statement!r} occurs {len(matches)} times in {path}"
    return matches[0]


@pytest.mark.parametrize("version", VERSIONS)
def test_version_materializes_with_its_defining_change(trees: dict[str, Path], version: str) -> None:
    source = (trees[version] / ENTRYPOINT_FILE).read_text()
    has_crash = CRASH_STATEMENT in source
    has_loader = "DataLoader(" in source
    has_manual_batching = "torch.stack([train_data[idx] for idx in batch_indices]).to(device)" in source
    assert (has_crash, has_loader, has_manual_batching) == {
        "v7": (True, True, False),
        "v7-fixed": (False, True, False),
        "v6": (True, False, True),
    }[version]
    assert ("len(env['train_loader'].dataset)" in source) == (version == "v7-fixed")
    assert ((trees[version] / "tests" / "test_fine_tuning_smoke.py").is_file()) == (version == "v7-fixed")


def test_v7_suite_never_calls_the_entrypoint(trees: dict[str, Path]) -> None:
    for test_file in (trees["v7"] / "tests").glob("*.py"):
        assert "test_fine_tuning" not in test_file.read_text(), test_file
    assert "test_fine_tuning" in (trees["v7-fixed"] / "tests" / "test_fine_tuning_smoke.py").read_text()


def test_unknown_version_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(MATERIALIZE), "v99", str(tmp_path / "out")], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "unknown version 'v99'" in done.stderr and "v7-fixed" in done.stderr
    assert not (tmp_path / "out").exists()


def test_v7_entrypoint_crashes_on_train_data_key(trees: dict[str, Path], outcomes: dict[str, dict]) -> None:
    tree = trees["v7"]
    outcome = outcomes["v7"]
    assert outcome["ok"] is False
    assert (outcome["type"], outcome["args"]) == ("KeyError", ["train_data"])
    assert Path(outcome["file"]).resolve() == (tree / ENTRYPOINT_FILE).resolve()
    assert outcome["line"] == _line_of(tree / ENTRYPOINT_FILE, CRASH_STATEMENT)
    assert outcome["text"] == CRASH_STATEMENT


@pytest.mark.parametrize("version", ["v7-fixed", "v6"])
def test_working_versions_train(outcomes: dict[str, dict], version: str) -> None:
    outcome = outcomes[version]
    assert outcome["ok"] is True, outcome
    losses = outcome["loss_history"]
    assert outcome["n_steps"] == len(losses) >= MIN_OPTIMIZER_STEPS
    assert all(math.isfinite(loss) for loss in losses)
    assert math.isfinite(outcome["final_loss"])
    assert sum(losses[-4:]) < sum(losses[:4])


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("version", VERSIONS)
def test_example_suite_results(trees: dict[str, Path], version: str) -> None:
    tree = trees[version]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
         f"--rootdir={tree}", "-c", str(tree / "pyproject.toml"), "tests"],
        cwd=tree, env=_child_env(), capture_output=True, text=True, timeout=180,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:]
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (passed|skipped|failed|error)", output.splitlines()[-1])}
    own_tests = 16 + (2 if version == "v7-fixed" else 0)
    expected = {"passed": own_tests + 3} if _cuda_available() else {"passed": own_tests, "skipped": 3}
    assert {k: v for k, v in counts.items() if v} == expected, output[-3000:]
    if not _cuda_available():
        assert len(re.findall(r"SKIPPED \[1\] tests/test_amp_utils\.py:\d+: CUDA not available", output)) == 3

    warned = re.search(r"tests/test_amp_utils\.py:(\d+): FutureWarning: `torch\.cuda\.amp\.autocast", output)
    assert warned, output[-3000:]
    deprecated_line = (tree / "tests" / "test_amp_utils.py").read_text().splitlines()[int(warned.group(1)) - 1]
    assert "torch.cuda.amp.autocast(" in deprecated_line
