"""The policy comes from the CI, not from the change: the target may only tighten it."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, TARGETS, TRAINGATE, GateRun, cli_env, run_gate
from traingate.pipeline.model.config import PolicyConfig
from traingate.pipeline.gate.policy_source import (
    POLICY_ENV,
    CiPolicy,
    PolicyFileError,
    ci_policy_path,
    load_ci_policy,
    resolve_policy,
)


def _target_policy(**values: object) -> PolicyConfig:
    return PolicyConfig.model_validate(values)


def _ci(tmp_path: Path, text: str) -> CiPolicy:
    path = tmp_path / "ci-policy.toml"
    path.write_text(text)
    return load_ci_policy(path)


# The thresholds and severities these tests set; the policy's switches are tested where they act.
_THRESHOLDS = ("amp_speedup_min", "amp_memory_reduction_min", "amp_accuracy_tolerance", "block_on")


def _sources(provenance) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {s.key: s.source for s in provenance.settings if s.key in _THRESHOLDS}


def test_without_any_policy_the_defaults_apply() -> None:
    policy, provenance = resolve_policy(PolicyConfig(), None, None)
    assert policy == PolicyConfig()
    assert set(_sources(provenance).values()) == {"default"} and provenance.ignored == []


def test_the_target_cannot_loosen_the_defaults() -> None:
    target = _target_policy(block_on=[], amp_speedup_min=0.5, amp_memory_reduction_min=0.0, amp_accuracy_tolerance=0.9)
    policy, provenance = resolve_policy(target, "pyproject.toml", None)
    assert policy == PolicyConfig()
    assert {i.key for i in provenance.ignored} == set(_THRESHOLDS)
    [block_on] = [i for i in provenance.ignored if i.key == "block_on"]
    assert block_on.value == [] and block_on.file == "pyproject.toml" and "critical, high" in block_on.reason


def test_the_target_may_tighten() -> None:
    target = _target_policy(block_on=["medium"], amp_speedup_min=2.0, amp_accuracy_tolerance=0.001)
    policy, provenance = resolve_policy(target, "traingate.toml", None)
    assert [s.value for s in policy.block_on] == ["critical", "high", "medium"]
    assert (policy.amp_speedup_min, policy.amp_accuracy_tolerance) == (2.0, 0.001)
    assert policy.amp_memory_reduction_min == 0.40
    sources = _sources(provenance)
    assert sources == {"block_on": "target", "amp_speedup_min": "target", "amp_accuracy_tolerance": "target", "amp_memory_reduction_min": "default"}
    # Adding "medium" while leaving out critical and high: the addition counts, the removal does not.
    assert [i.key for i in provenance.ignored] == ["block_on"]


def test_a_ci_policy_sets_the_floor_even_below_the_defaults(tmp_path: Path) -> None:
    ci = _ci(tmp_path, 'block_on = ["critical"]\namp_speedup_min = 1.1\n')
    policy, provenance = resolve_policy(PolicyConfig(), None, ci)
    assert [s.value for s in policy.block_on] == ["critical"] and policy.amp_speedup_min == 1.1
    assert _sources(provenance) == {"block_on": "ci-policy", "amp_speedup_min": "ci-policy", "amp_memory_reduction_min": "default", "amp_accuracy_tolerance": "default"}
    assert provenance.ci_file == str(tmp_path / "ci-policy.toml")


def test_under_a_ci_policy_the_target_still_only_tightens(tmp_path: Path) -> None:
    ci = _ci(tmp_path, 'block_on = ["critical"]\namp_speedup_min = 1.1\n')
    target = _target_policy(block_on=["high"], amp_speedup_min=1.0)
    policy, provenance = resolve_policy(target, "pyproject.toml", ci)
    assert [s.value for s in policy.block_on] == ["critical", "high"]
    assert policy.amp_speedup_min == 1.1
    ignored = {i.key: i for i in provenance.ignored}
    assert set(ignored) == {"block_on", "amp_speedup_min"}
    assert "1.1 (ci-policy)" in ignored["amp_speedup_min"].reason


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("block_on = [\"severe\"]\n", "block_on.0"),
        ("amp_speedup_min = nan\n", "amp_speedup_min: Input should be a finite number"),
        ("timeout_s = 5\n", "timeout_s: Extra inputs"),
        ("block_on = \n", "not valid TOML"),
    ],
)
def test_a_bad_ci_policy_file_is_one_line_naming_the_key(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(PolicyFileError) as info:
        _ci(tmp_path, text)
    assert words in str(info.value) and "\n" not in str(info.value)


def test_the_option_wins_over_the_environment(tmp_path: Path) -> None:
    env = {POLICY_ENV: str(tmp_path / "env.toml")}
    assert ci_policy_path(tmp_path / "opt.toml", env) == tmp_path / "opt.toml"
    assert ci_policy_path(None, env) == tmp_path / "env.toml"
    assert ci_policy_path(None, {POLICY_ENV: "  "}) is None


def _policy_rows(run: GateRun) -> dict[str, dict[str, object]]:
    return {s["key"]: s for s in run.report["policy"]["settings"]}


@pytest.mark.slow
def test_the_target_setting_block_on_empty_still_blocks(gate) -> None:  # type: ignore[no-untyped-def]
    run = gate("policy_loosened", "--stages", "execution")
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    [failure] = run.findings("test-failure")
    assert failure["blocking"] and failure["location"]["path"] == "tests/test_scaling.py"
    rows = _policy_rows(run)
    assert rows["block_on"] == {"key": "block_on", "value": ["critical", "high"], "source": "default"}
    assert {i["key"]: i["value"] for i in run.report["policy"]["ignored"]} == {
        "block_on": [], "amp_speedup_min": 0.5, "amp_accuracy_tolerance": 0.9,
    }
    md = (run.out / "report.md").read_text()
    assert "## Policy" in md and "`block_on = []` in pyproject.toml" in md


@pytest.mark.slow
def test_a_ci_policy_file_decides_what_blocks(tmp_path: Path) -> None:
    ci = tmp_path / "ci.toml"
    ci.write_text('block_on = ["critical"]\n')
    run = run_gate(TARGETS / "policy_loosened", tmp_path / "out", "--stages", "execution", "--policy", str(ci))
    # The CI itself chose that only critical findings block: the high test failure is reported, not blocking.
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    [failure] = run.findings("test-failure")
    assert failure["severity"] == "high" and not failure["blocking"]
    assert _policy_rows(run)["block_on"]["source"] == "ci-policy"
    assert run.report["policy"]["ci_file"] == str(ci)
    assert "block_on" in {i["key"] for i in run.report["policy"]["ignored"]}


@pytest.mark.slow
def test_the_policy_environment_variable_is_read(tmp_path: Path) -> None:
    ci = tmp_path / "ci.toml"
    ci.write_text('block_on = ["critical", "high", "medium"]\n')
    done = subprocess.run(
        [*TRAINGATE, "run", str(TARGETS / "policy_loosened"), "--out", str(tmp_path / "out"), "--stages", "execution"],
        capture_output=True, text=True, cwd=REPO, env={**cli_env(), POLICY_ENV: str(ci)}, timeout=300,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["policy"]["ci_file"] == str(ci)
    assert {s["key"]: s["value"] for s in report["policy"]["settings"]}["block_on"] == ["critical", "high", "medium"]
