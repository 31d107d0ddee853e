"""A package the target imports that is not installed is the environment's limit, not a crash of
the target's code: one blocking `environment` finding per run, naming every missing module."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, line_of
from traingate.pipeline.model.config import PolicyConfig, TargetConfig
from traingate.pipeline.model.schema import Category
from traingate.stages.base import StageContext
from traingate.stages.contract.messages import ExceptionRecord
from traingate.stages.agent.declared import declared_requirements, distributions_of
from traingate.stages.agent.environment import MissingPackages, environment_finding, install_advice, missing_module, missing_packages
from traingate.stages.agent.imports import own_modules, required_imports

FIXTURE = TARGETS / "env_missing_package"
FIRST, SECOND, TEST_ONLY = "traingate_absent_pkg_xyz", "traingate_absent_pkg_second", "traingate_absent_plot_pkg"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def _raised(type_: str, message: str) -> ExceptionRecord:
    return ExceptionRecord(type=type_, message=message, traceback="", frames=[], target_frame=None)


def _no_module(name: str) -> ExceptionRecord:
    return _raised("ModuleNotFoundError", f"No module named '{name}'")


def test_optional_relative_and_type_checking_imports_are_not_required(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "train.py": (
            "import os, absent_a.sub\nfrom absent_b import x\nfrom . import sibling\nfrom typing import TYPE_CHECKING\n"
            "try:\n    import absent_optional\nexcept ImportError:\n    absent_optional = None\n"
            "if TYPE_CHECKING:\n    import absent_typing\n"
            "def late():\n    import absent_c\n"
        ),
    })
    assert [(s.module, s.line) for s in required_imports(root).sites] == [("os", 1), ("absent_a", 1), ("absent_b", 2), ("typing", 4), ("absent_c", 12)]


def test_the_scan_stops_at_its_time_budget_and_says_how_far_it_read(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"a.py": "import traingate_absent_a\n", "b.py": "import traingate_absent_b\n"})
    scan = required_imports(root, budget_s=-1.0)
    assert (scan.files_read, scan.files, scan.sites) == (0, 2, [])
    assert [s.module for s in required_imports(root).sites] == ["traingate_absent_a", "traingate_absent_b"]


def test_the_targets_own_modules_stdlib_and_installed_packages_are_never_missing(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"src/mypkg/__init__.py": "", "helpers.py": "", "scripts/tool.py": ""})
    assert {"mypkg", "helpers", "tool", "src", "scripts"} <= own_modules(root)
    for name in ("mypkg", "helpers.sub", "json", "pytest", "traingate_absent_pkg_xyz.sub"):
        found = missing_module(root, _no_module(name))
        assert found == ("traingate_absent_pkg_xyz" if name.startswith("traingate_absent") else None), name
    # Not an import failure, or one the gate cannot read a module from.
    assert missing_module(root, _raised("ValueError", "No module named 'traingate_absent_pkg_xyz'")) is None
    assert missing_module(root, _raised("ImportError", "cannot import name 'x' from 'json'")) is None


def test_requirements_and_pyproject_declarations_are_read(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "requirements.txt": "# training\n-r base.txt\n--index-url https://example.invalid\nscikit-learn>=1.2  # metrics\nPyYAML\n",
        "requirements-dev.txt": "pytest\n",
        "pyproject.toml": '[project]\nname = "x"\ndependencies = ["Datasets[audio]>=2; python_version>\'3.8\'"]\n'
                          '[project.optional-dependencies]\nviz = ["matplotlib"]\n',
    })
    declared = declared_requirements(root)
    assert set(declared) == {"scikit-learn", "pyyaml", "pytest", "datasets", "matplotlib"}
    assert declared["scikit-learn"].source == "requirements.txt" and declared["scikit-learn"].spec == "scikit-learn>=1.2"
    assert declared["datasets"].source == "pyproject.toml [project] dependencies"
    assert declared["matplotlib"].source == "pyproject.toml [project.optional-dependencies] viz"
    assert distributions_of("sklearn")[0] == "scikit-learn" and distributions_of("yaml")[0] == "pyyaml"


def _ctx(root: Path) -> StageContext:
    # An empty block_on: the finding blocks by its rule, whatever the policy.
    config = TargetConfig(policy=PolicyConfig(block_on=[]))
    return StageContext(stage="performance", root=root, config=config, device="cpu", deadline=time.time() + 60, scratch=root / ".scratch")


def test_one_finding_lists_every_missing_module_with_the_install_line(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "train.py": "import torch\nimport traingate_absent_one\nfrom model import Net\n",
        "model.py": "import traingate_absent_two.layers\n",
        "tests/test_train.py": "import traingate_absent_three\n",
        "requirements.txt": "traingate-absent-one==1.0\n",
    })
    found = missing_packages(root, "traingate_absent_one")
    assert found.needed == ["traingate_absent_one", "traingate_absent_two"] and found.tests_only == ["traingate_absent_three"]
    finding = environment_finding(_ctx(root), _no_module("traingate_absent_one"), "traingate_absent_one", "The smoke call", None, run="entrypoint")
    assert finding.category is Category.ENVIRONMENT and finding.blocking
    assert finding.location is not None and (finding.location.path, finding.location.line) == ("train.py", 2)
    data = finding.evidence.data
    assert data["missing"] == ["traingate_absent_one", "traingate_absent_two"] and data["undeclared"] == ["traingate_absent_two"]
    assert data["declared"] == {"traingate_absent_one": {"spec": "traingate-absent-one==1.0", "source": "requirements.txt"}}
    assert "`pip install traingate-absent-one traingate-absent-two`" in finding.fix
    assert "Declare traingate-absent-two in" in finding.fix
    assert "model.py:1" in finding.problem and "traingate_absent_three" in finding.problem


def test_a_module_installed_under_another_name_is_installed_by_that_name() -> None:
    found = MissingPackages(needed=["sklearn", "traingate_absent_x"], tests_only=[], files_read=1, files=1)
    assert found.install_line() == "pip install scikit-learn traingate-absent-x"
    assert "Declare scikit-learn (for sklearn), traingate-absent-x in" in install_advice(found)


@pytest.fixture
def env_gate(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("env_missing_package")[0]


@pytest.mark.slow
def test_a_missing_package_blocks_with_one_environment_finding_naming_every_module(env_gate: GateRun) -> None:
    assert env_gate.returncode == 1 and env_gate.report["decision"] == "BLOCK", env_gate.stdout + env_gate.stderr
    [env] = env_gate.findings("environment")
    assert env["blocking"] and env["stage"] == "execution"
    assert (env["location"]["path"], env["location"]["line"]) == ("train.py", line_of(FIXTURE / "train.py", "planted: not installed"))
    data = env["evidence"]["data"]
    assert data["missing"] == sorted([FIRST, SECOND]) and data["undeclared"] == []
    assert data["sites"][SECOND] == [f"features.py:{line_of(FIXTURE / 'features.py', 'planted: the second')}"]
    assert data["declared"][FIRST]["source"] == "requirements.txt"
    assert data["declared"][SECOND]["source"] == "pyproject.toml [project] dependencies"
    assert "traingate_absent_optional_pkg" not in env["problem"]  # imported under try/except ImportError
    assert f"pip install {SECOND} traingate-absent-pkg-xyz" in env["fix"]


@pytest.mark.slow
def test_no_crash_or_collection_error_is_reported_for_it(env_gate: GateRun) -> None:
    assert not {"entrypoint-crash", "collection-error", "stage-error"} & env_gate.categories()
    # The test module's own import of a missing package stays a low test-environment.
    [test_env] = env_gate.findings("test-environment")
    assert test_env["location"]["path"] == "tests/test_plots.py" and not test_env["blocking"]
    # The later stages would only hit it again: skipped, saying why.
    for name in ("performance", "concurrency", "correctness"):
        stage = env_gate.stage(name)
        assert stage["status"] == "skipped" and "not installed here" in stage["skipped_reason"], stage
