"""Waivers (configuration and inline) and the new-findings policy, decided by the gate's own process."""

from __future__ import annotations

import json
from datetime import date
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, gate_once, line_of, run_gate, shared_folder
from traingate.pipeline.model.config import PolicyConfig, TargetConfig
from traingate.pipeline.gate.config_file import ConfigError, load_config
from traingate.pipeline.model.findings import finding, stage_error
from traingate.pipeline.gate.policy_source import load_ci_policy, resolve_policy
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Finding, Location, Severity
from traingate.pipeline.gate.waivers import Adjudicator, scan_inline_waivers
from traingate.stages.performance.rules import HOST_SYNC, MEMORY_LEAK

WAIVE = TARGETS / "waive_findings"
HIGH = {Severity.CRITICAL, Severity.HIGH}


def _by_test(report: dict) -> dict[str, dict]:
    """test-failure findings keyed by the failing test's function."""
    return {f["location"]["function"]: f for s in report["stages"] for f in s["findings"] if f["category"] == "test-failure"}


def _ci_policy(tmp_path: Path, text: str, name: str = "ci-policy.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_waived_findings_stay_in_the_report_and_do_not_block(tmp_path: Path) -> None:
    run = run_gate(WAIVE, tmp_path / "out", "--stages", "execution")
    failures = _by_test(run.report)
    assert set(failures) == {"test_scale_by_id", "test_scale_by_place", "test_scale_expired", "test_scale_inline"}

    by_id, by_place, inline = failures["test_scale_by_id"], failures["test_scale_by_place"], failures["test_scale_inline"]
    for waived in (by_id, by_place, inline):
        assert waived["waived"] is not None and not waived["blocking"] and waived["severity"] == "high"
    assert by_id["waived"]["source"] == "config" and by_id["waived"]["origin"].endswith("#1")
    assert by_place["waived"]["reason"] == "flaky on CI runners, tracked separately" and by_place["waived"]["expires"] == "2999-12-31"
    assert inline["waived"]["source"] == "inline"
    assert inline["waived"]["origin"] == f"tests/test_inline.py:{line_of(WAIVE / 'tests/test_inline.py', 'traingate: ignore')}"

    # The expired waiver no longer applies: that failure is the only thing that blocks.
    expired = failures["test_scale_expired"]
    assert expired["waived"] is None and expired["blocking"]
    assert run.returncode == 1 and run.report["decision"] == "BLOCK"
    assert [f["id"] for f in run.findings() if f["blocking"]] == [expired["id"]]

    entries = {e["origin"].rsplit(" ", 1)[-1]: e for e in run.report["acceptance"]["waivers"]}
    assert entries["#1"]["status"] == "applied" and entries["#1"]["matched"] == [by_id["id"]]
    assert entries["#2"]["status"] == "applied"
    assert entries["#3"]["status"] == "expired" and entries["#3"]["matched"] == [expired["id"]] and "2020-01-01" in entries["#3"]["note"]
    assert entries["#4"]["status"] == "unused" and entries["#4"]["categories"] == ["host-sync"]

    md = (run.out / "report.md").read_text()
    assert "## Waivers and accepted findings" in md
    assert "**expired**" in md and "**unused**" in md and "flaky on CI runners" in md


@pytest.fixture
def no_waivers_run(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    """The session's one run of the target under a CI policy that forbids waivers, read by
    the tests of that policy and of the new-findings rule that starts from it."""
    shared = shared_folder(tmp_path_factory)

    def make(out: Path) -> GateRun:
        policy = _ci_policy(shared, "allow_waivers = false\n", name="waive-no-waivers.toml")
        return run_gate(TARGETS / "waive_findings", out, "--stages", "execution", "--policy", str(policy))

    return gate_once(shared, "waive-no-waivers", make)[0]


def test_the_ci_policy_can_forbid_waivers(no_waivers_run: GateRun) -> None:
    run = no_waivers_run
    failures = _by_test(run.report)
    assert all(f["blocking"] and f["waived"] is None for f in failures.values()) and len(failures) == 4
    assert run.returncode == 1
    acceptance = run.report["acceptance"]
    assert acceptance["waivers_allowed"] is False
    assert {e["status"] for e in acceptance["waivers"]} == {"disallowed"}
    assert "allow_waivers = false" in (run.out / "report.md").read_text()


def test_the_target_cannot_allow_what_the_ci_forbids(tmp_path: Path) -> None:
    ci = load_ci_policy(_ci_policy(tmp_path, 'allow_waivers = false\nblock = "all"\n'))
    policy, provenance = resolve_policy(PolicyConfig.model_validate({"allow_waivers": True, "block": "new"}), "pyproject.toml", ci)
    assert policy.allow_waivers is False and policy.block == "all"
    assert {i.key for i in provenance.ignored} >= {"allow_waivers", "block"}


def test_only_the_ci_can_switch_to_new_findings() -> None:
    policy, provenance = resolve_policy(PolicyConfig.model_validate({"block": "new"}), "pyproject.toml", None)
    assert policy.block == "all" and "block" in {i.key for i in provenance.ignored}
    # Tightening is the target's right: "all" under a CI "new".
    tighter, _ = resolve_policy(PolicyConfig.model_validate({"block": "all"}), "pyproject.toml", None)
    assert tighter.block == "all"


def test_a_reasonless_waiver_is_a_configuration_error(tmp_path: Path) -> None:
    run = run_gate(TARGETS / "waive_reasonless", tmp_path / "out", "--stages", "execution")
    assert run.returncode == 2
    assert "tool.traingate.waive.0.reason" in run.stderr and "reason" in run.stderr
    [error] = run.findings("config-error")
    assert error["blocking"] and run.report["decision"] == "BLOCK"


def _target(tmp_path: Path, pyproject: str, files: dict[str, str] | None = None) -> Path:
    root = tmp_path / "target"
    root.mkdir()
    (root / "pyproject.toml").write_text(pyproject)
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.mark.parametrize(
    ("waiver", "expected"),
    [
        ('category = "host-synk"\npath = "a.py"\nreason = "x"', "unknown category 'host-synk'"),
        ('category = "hang"\npath = "a.py"\nreason = "x"', "hang findings cannot be waived"),
        ('category = "stage-error"\npath = "a.py"\nreason = "x"', "cannot be waived"),
        ('id = "abc"\ncategory = "host-sync"\npath = "a.py"\nreason = "x"', "either `id` or `category` + `path`"),
        ('category = "host-sync"\nreason = "x"', "`category` and `path`"),
        ('id = "abc"', "reason"),
    ],
)
def test_bad_waivers_name_the_key(tmp_path: Path, waiver: str, expected: str) -> None:
    root = _target(tmp_path, f"[tool.traingate]\n\n[[tool.traingate.waive]]\n{waiver}\n")
    with pytest.raises(ConfigError) as err:
        load_config(root)
    assert err.value.key.startswith("tool.traingate.waive.0") and expected in str(err.value)


def test_traingate_toml_uses_a_bare_waive_table(tmp_path: Path) -> None:
    root = tmp_path / "target"
    root.mkdir()
    (root / "traingate.toml").write_text('[[waive]]\ncategory = "host-sync"\npath = "loop.py"\nline = 4\nreason = "measured once per epoch"\nexpires = 2999-01-01\n')
    config, source = load_config(root)
    [waiver] = config.waive
    assert source == "traingate.toml" and waiver.category is HOST_SYNC and waiver.line == 4 and waiver.expires == date(2999, 1, 1)
    assert config.config_file == "traingate.toml"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("x = 1  # traingate: ignore[host-sync]", "needs a reason"),
        ("x = 1  # traingate: ignore[host-synk] typo", "unknown category 'host-synk'"),
        ("x = 1  # traingate: ignore[leftover-process] it is fine", "cannot be waived"),
    ],
)
def test_bad_inline_waivers_are_configuration_errors(tmp_path: Path, line: str, expected: str) -> None:
    root = _target(tmp_path, "[tool.traingate]\n", {"pkg/loop.py": f"import os\n{line}\n"})
    with pytest.raises(ConfigError) as err:
        load_config(root)
    assert err.value.file == "pkg/loop.py" and err.value.key == "line 2" and expected in err.value.message


def test_only_comments_are_inline_waivers(tmp_path: Path) -> None:
    text = 'DOC = "# traingate: ignore[host-sync]"\nloss.item()  # traingate: ignore[host-sync, memory-leak] logged once per epoch\n'
    root = _target(tmp_path, "[tool.traingate]\n", {"loop.py": text, ".venv/lib/x.py": "# traingate: ignore[bogus]\n"})
    [inline] = scan_inline_waivers(root)
    assert (inline.path, inline.line, inline.reason) == ("loop.py", 2, "logged once per epoch")
    assert inline.categories == (HOST_SYNC, MEMORY_LEAK)


def _sync_finding(path: str = "loop.py", line: int = 7, block_on: set[Severity] = HIGH) -> Finding:
    return finding(
        stage="performance", category=HOST_SYNC, severity=Severity.HIGH, title="sync", location=Location(path=path, line=line, function="train"),
        problem="p", evidence=Evidence(kind=EvidenceKind.MEASURED, summary="s"), block_on=block_on, key="loss.item()",
    )


def _config(waive: list[dict] | None = None, **policy: object) -> TargetConfig:
    return TargetConfig.model_validate({"waive": waive or [], "policy": policy})


def test_integrity_findings_are_never_waived_even_by_id() -> None:
    error = stage_error("performance", "the agent crashed", reason="agent-exception", block_on=HIGH)
    judge = Adjudicator(_config([{"id": error.id, "reason": "noisy"}]), None, date(2026, 1, 1))
    [judged] = judge.apply([error])
    assert judged.blocking and judged.waived is None
    [entry] = judge.summary().waivers
    assert entry.status == "refused"


def test_line_and_function_narrow_a_place_waiver() -> None:
    waive = [{"category": "host-sync", "path": "./loop.py", "line": 7, "reason": "once per epoch"}, {"category": "host-sync", "path": "loop.py", "function": "evaluate", "reason": "eval only"}]
    judge = Adjudicator(_config(waive), None, date(2026, 1, 1))
    at_seven, at_nine = judge.apply([_sync_finding(line=7), _sync_finding(line=9)])
    assert at_seven.waived is not None and not at_seven.blocking
    assert at_nine.waived is None and at_nine.blocking
    assert [e.status for e in judge.summary().waivers] == ["applied", "unused"]


def test_a_waiver_expires_after_its_date() -> None:
    waive = [{"category": "host-sync", "path": "loop.py", "reason": "until the fix", "expires": "2026-03-01"}]
    [on_the_day] = Adjudicator(_config(waive), None, date(2026, 3, 1)).apply([_sync_finding()])
    [after] = Adjudicator(_config(waive), None, date(2026, 3, 2)).apply([_sync_finding()])
    assert on_the_day.waived is not None and after.waived is None and after.blocking


def test_new_without_a_baseline_behaves_as_all_and_says_so() -> None:
    judge = Adjudicator(_config(block="new"), None, date(2026, 1, 1))
    [judged] = judge.apply([_sync_finding()])
    summary = judge.summary()
    assert judged.blocking and judged.baseline_status is None
    assert summary.block == "all" and "no --baseline" in summary.block_note


def test_new_findings_policy_against_a_baseline(tmp_path: Path, no_waivers_run: GateRun) -> None:
    """Clean as you code: with a CI policy `block = "new"`, only findings the baseline lacks block."""
    no_waivers = _ci_policy(tmp_path, "allow_waivers = false\n")
    first = no_waivers_run
    failures = _by_test(first.report)
    assert len(failures) == 4 and all(f["blocking"] for f in failures.values())

    # The baseline: the same report without one of the failures, plus one failure since fixed.
    new_id = failures["test_scale_by_id"]["id"]
    baseline = json.loads((first.out / "report.json").read_text())
    stage = baseline["stages"][0]
    gone = {**stage["findings"][0], "id": "0123456789abcdef"}
    stage["findings"] = [f for f in stage["findings"] if f["id"] != new_id] + [gone]
    (tmp_path / "baseline.json").write_text(json.dumps(baseline))

    new_policy = _ci_policy(tmp_path, 'allow_waivers = false\nblock = "new"\n', name="ci-new.toml")
    second = run_gate(WAIVE, tmp_path / "v2", "--stages", "execution", "--policy", str(new_policy), "--baseline", str(tmp_path / "baseline.json"))
    now = _by_test(second.report)
    assert second.returncode == 1
    assert [f["id"] for f in second.findings() if f["blocking"]] == [new_id]
    assert now["test_scale_by_id"]["baseline_status"] == "new"
    persisting = [f for name, f in now.items() if name != "test_scale_by_id"]
    assert all(f["baseline_status"] == "persisting" and not f["blocking"] for f in persisting)

    comparison = second.report["baseline"]
    assert comparison["new_findings"] == [new_id] and comparison["fixed_findings"] == ["0123456789abcdef"]
    assert sorted(comparison["persisting_findings"]) == sorted(f["id"] for f in persisting)
    assert second.report["acceptance"]["block"] == "new" and "3 persisting" in second.report["acceptance"]["block_note"]
    md = (second.out / "report.md").read_text()
    assert "**New**" in md and "**Persisting**" in md and "**Resolved**" in md and "0123456789abcdef" in md

    # The same baseline under the default "all": every failure blocks again.
    third = run_gate(WAIVE, tmp_path / "v3", "--stages", "execution", "--policy", str(no_waivers), "--baseline", str(tmp_path / "baseline.json"))
    assert len([f for f in third.findings() if f["blocking"]]) == 4
