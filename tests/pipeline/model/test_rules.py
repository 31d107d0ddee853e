"""The rule table, `traingate explain`, the shared finding builders, and fingerprints built from data."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from types import SimpleNamespace
from pathlib import Path
from typing import Any

import pytest

from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.findings import SMOKE_CALL_RUN, hang_finding, stage_error
from traingate.pipeline.supervision.isolation import ChildResult
from traingate.pipeline.gate.orchestrator import ANY_STAGE_CATEGORIES, RunRequest, _skip_reason, compare_baseline
from traingate.pipeline.model.registry import build_registry, parts
from traingate.pipeline.model.registry import rule_for, rule_table
from traingate.pipeline.model.rules import ANY_STAGE
from traingate.pipeline.model.schema import Blocks, Category, Evidence, EvidenceKind, Finding, Location, Metric, Severity, StageReport, StageStatus, TrainingStopped
from traingate.stages.base import StageContext
from tests import report_builders
from tests.conftest import REPO, TARGETS, GateRun, cli_in_process, line_of, run_gate
from traingate.stages.concurrency.rules import GRADSCALER_PROTOCOL
from traingate.stages.execution.rules import DEPRECATED_API
from traingate.stages.performance.rules import INPUT_STALL, MEMORY_LEAK
from traingate.stages.shared_categories import ENTRYPOINT_CRASH

RULES = rule_table().rules
sub_rules = rule_table().sub_rules

BLOCK_ON = {Severity.CRITICAL, Severity.HIGH}


def test_every_category_has_exactly_one_rule_and_every_rule_a_stable_id() -> None:
    assert sorted(r.category.value for r in RULES if not r.sub) == sorted({c.value for c in Category.builtin()} | {c.value for stage in build_registry().values() for c in parts(stage).categories})
    assert len({r.id for r in RULES}) == len(RULES)
    for rule in RULES:
        assert rule.description and rule.check and rule.measure and rule.blocks_text and rule.impact and rule.fix
        assert rule.doc == "docs/categories.md"
        assert rule.id == (f"{rule.category.value}/{rule.sub}" if rule.sub else rule.category.value)
    # GradScaler's protocol rules are rules of their own, each with its id.
    assert {r.sub for r in sub_rules(GRADSCALER_PROTOCOL)} == {
        "clip-before-unscale", "step-bypasses-scaler", "missing-update", "unscale-twice", "unscale-after-step", "stale-gradients",
    }
    assert all(r.stage == "concurrency" for r in sub_rules(GRADSCALER_PROTOCOL))


def test_when_a_rule_blocks_is_the_rules_mode_and_the_policy() -> None:
    never, always = rule_for(DEPRECATED_API), rule_for(Category.STAGE_ERROR)
    assert never.blocks is Blocks.NEVER and always.blocks is Blocks.ALWAYS
    assert not never.blocking(Severity.CRITICAL, EvidenceKind.OBSERVED, BLOCK_ON)
    assert always.blocking(Severity.LOW, EvidenceKind.OBSERVED, set())
    assert not always.blocking(Severity.CRITICAL, EvidenceKind.STATIC, BLOCK_ON)  # static evidence never blocks
    policy = rule_for(MEMORY_LEAK)
    assert policy.blocking(Severity.HIGH, EvidenceKind.MEASURED, BLOCK_ON) and not policy.blocking(Severity.MEDIUM, EvidenceKind.MEASURED, BLOCK_ON)


def test_a_finding_is_built_from_its_rule(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    plain = ctx.finding(category=INPUT_STALL, title="t", location=None, problem="p", evidence=Evidence(kind=EvidenceKind.MEASURED))
    assert plain.rule == "input-stall" and plain.severity is rule_for(INPUT_STALL).severity
    sub = ctx.finding(category=GRADSCALER_PROTOCOL, rule="gradscaler-protocol/missing-update", title="t", location=None, problem="p", evidence=Evidence(kind=EvidenceKind.OBSERVED))
    assert sub.rule == "gradscaler-protocol/missing-update" and sub.blocking
    deprecated = ctx.finding(category=DEPRECATED_API, severity=Severity.CRITICAL, title="t", location=None, problem="p", evidence=Evidence(kind=EvidenceKind.OBSERVED))
    assert not deprecated.blocking
    with pytest.raises(ValueError):
        ctx.finding(category=MEMORY_LEAK, rule="gradscaler-protocol/missing-update", title="t", location=None, problem="p", evidence=Evidence(kind=EvidenceKind.OBSERVED))


def test_the_stages_build_findings_one_way() -> None:
    """`ctx.finding` (and the shared builders it stands on) is the one way a stage makes a finding:
    no module of `stages/` calls the schema's `Finding.create` or `findings.finding` itself."""
    callers = []
    for path in sorted((REPO / "stages").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = node.func.value
                name = f"{owner.id}.{node.func.attr}" if isinstance(owner, ast.Name) else node.func.attr
                if name in {"Finding.create", "findings.finding"}:
                    callers.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert callers == ["stages/base.py:" + str(_line_of_ctx_finding())]


def _line_of_ctx_finding() -> int:
    source = (REPO / "stages" / "base.py").read_text()
    return next(i for i, line in enumerate(source.splitlines(), 1) if "return findings.finding(" in line)


def test_a_rules_stage_is_the_stage_that_reports_its_category() -> None:
    owners = {c: name for name, stage in build_registry().items() for c in parts(stage).categories if c not in ANY_STAGE_CATEGORIES}
    for rule in RULES:
        assert parts(build_registry()[rule.stage]).categories >= {rule.category} if rule.stage != ANY_STAGE else True
        if rule.category in ANY_STAGE_CATEGORIES:
            assert rule.stage == ANY_STAGE, rule.category
        else:
            assert owners.get(rule.category) == rule.stage, rule.category


def test_the_new_any_stage_categories() -> None:
    assert rule_for(Category.LEFTOVER_PROCESS).severity is Severity.HIGH
    assert rule_for(Category.TARGET_MODIFIED).severity is Severity.CRITICAL
    assert {Category.LEFTOVER_PROCESS, Category.TARGET_MODIFIED} <= ANY_STAGE_CATEGORIES


def test_the_categories_page_names_every_category_with_its_one_liner() -> None:
    page = (REPO / "docs" / "categories.md").read_text()
    for rule in RULES:
        if not rule.sub:
            assert f"[`{rule.id}`](#{rule.id}): {rule.description}\n" in page, rule.category
        assert f"`{rule.id}`\n" in page and f"- **What it checks**: {rule.check}\n" in page, rule.id
    readme = (REPO / "README.md").read_text()
    assert "(docs/categories.md)" in readme and "traingate explain" in readme


def _explain(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_in_process("explain", *args)


def test_explain_prints_a_rule_in_full() -> None:
    done = _explain("memory-leak")
    assert done.returncode == 0
    rule = rule_for(MEMORY_LEAK)
    for label, text in [("What it checks", rule.check), ("How it measures", rule.measure), ("What blocks", rule.blocks_text), ("How to fix", rule.fix)]:
        assert f"{label}: {text}" in done.stdout
    sub = _explain("gradscaler-protocol/missing-update")
    assert sub.returncode == 0 and sub.stdout.startswith("gradscaler-protocol/missing-update (concurrency stage")


def test_explain_without_a_category_lists_them_all() -> None:
    done = _explain()
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert len(lines) == len(RULES)
    for rule, line in zip(RULES, lines, strict=True):
        assert line.split()[0] == (rule.sub or rule.id) and rule.blocks.value in line.split() and line.endswith(rule.description)


def test_explain_an_unknown_category_is_a_usage_error() -> None:
    done = _explain("memory-leek")
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "memory-leek" in done.stderr


def _ctx(tmp_path: Path) -> StageContext:
    return StageContext(stage="performance", root=tmp_path, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=tmp_path)


def test_a_finding_without_impact_or_fix_gets_the_rules(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    generic = ctx.finding(category=INPUT_STALL, severity=Severity.HIGH, title="t", location=None, problem="p", evidence=Evidence(kind=EvidenceKind.MEASURED))
    rule = rule_for(INPUT_STALL)
    assert (generic.impact, generic.fix) == (rule.impact, rule.fix)
    specific = ctx.finding(category=INPUT_STALL, severity=Severity.HIGH, title="t", location=None, problem="p", evidence=Evidence(kind=EvidenceKind.MEASURED), fix="do this")
    assert specific.fix == "do this" and specific.impact == rule.impact


def test_the_orchestrator_builds_its_findings_without_the_stages() -> None:
    tree = ast.parse((REPO / "pipeline" / "gate" / "orchestrator.py").read_text())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    # The shared wire contract (traingate.stages.contract) and the code every process runs
    # (traingate.stages.common: the result channel) are the exceptions; the stages' own code,
    # and with it how findings are built, stays out of the gate's process.
    shared = ("traingate.stages.contract", "traingate.stages.common")
    assert imported and not [m for m in imported if m.startswith("traingate.stages") and not m.startswith(shared)]


# -- fingerprints are data, not prose --------------------------------------------------------------

def _create(title: str, problem: str, line: int) -> Finding:
    return Finding.create(
        stage="execution", category=ENTRYPOINT_CRASH, severity=Severity.CRITICAL, title=title,
        location=Location(path="train.py", line=line, function="fit"), problem=problem, impact="i", fix="f",
        evidence=Evidence(kind=EvidenceKind.OBSERVED), block_on=BLOCK_ON, key="KeyError\x1fbatch = data['train']",
    )


def test_a_finding_id_survives_reworded_prose_and_moved_lines() -> None:
    first = _create("The smoke call raised KeyError at train.py:12", "It raised.", 12)
    reworded = _create("Entrypoint crashed with KeyError (train.py:40)", "The call failed with a KeyError.", 40)
    assert first.id == reworded.id
    other_line = Finding.create(**{**_create_kwargs(), "key": "KeyError\x1fbatch = data['val']"})
    assert other_line.id != first.id


def _create_kwargs() -> dict[str, object]:
    return {
        "stage": "execution", "category": ENTRYPOINT_CRASH, "severity": Severity.CRITICAL, "title": "t",
        "location": Location(path="train.py", line=12, function="fit"), "problem": "p", "impact": "i", "fix": "f",
        "evidence": Evidence(kind=EvidenceKind.OBSERVED), "block_on": BLOCK_ON,
    }


def _child(duration_s: float = 5.0) -> ChildResult:
    return ChildResult(argv=["python"], returncode=-9, timed_out=True, duration_s=duration_s, stdout="", stderr="boom")


def test_stage_error_and_hang_ids_follow_their_codes_not_their_wording(tmp_path: Path) -> None:
    a = stage_error("performance", "the stage raised an exception", reason="agent-exception", block_on=BLOCK_ON, child=_child())
    b = stage_error("performance", "the stage's agent raised", reason="agent-exception", block_on=BLOCK_ON, child=_child())
    c = stage_error("performance", "the stage raised an exception", reason="malformed-result", block_on=BLOCK_ON, child=_child())
    assert a.id == b.id != c.id
    assert a.category is Category.STAGE_ERROR and a.blocking and a.evidence.data["reason"] == "agent-exception"
    assert a.impact == rule_for(Category.STAGE_ERROR).impact
    hang = hang_finding(SimpleNamespace(stage="execution", root=tmp_path, block_on=BLOCK_ON), _child(5.0), "The entrypoint smoke call m:f", run=SMOKE_CALL_RUN)
    reworded = hang_finding(SimpleNamespace(stage="execution", root=tmp_path, block_on=BLOCK_ON), _child(9.0), "Calling m:f once", run=SMOKE_CALL_RUN)
    other_run = hang_finding(SimpleNamespace(stage="execution", root=tmp_path, block_on=BLOCK_ON), _child(5.0), "The entrypoint smoke call m:f", run="pytest")
    assert hang.id == reworded.id != other_run.id
    assert hang.evidence.data["run"] == SMOKE_CALL_RUN


def test_later_stages_skip_on_the_smoke_call_hang_by_its_data_not_its_title(tmp_path: Path) -> None:
    def report_with(hang: Finding, stopped: bool) -> list[StageReport]:
        noted = [TrainingStopped(finding=hang.id, reason="hang")] if stopped else []
        return [StageReport(name="execution", status=StageStatus.BLOCKED, score=60, duration_s=1.0, summary="", findings=[hang], training_stopped=noted)]

    # The stage that saw the smoke call hang says so (`StageContext.stops_training`); a title, or
    # a hang of the test suite, says nothing to the stages after it.
    smoke = hang_finding(SimpleNamespace(stage="execution", root=tmp_path, block_on=BLOCK_ON), _child(), "A call with no telling title", run=SMOKE_CALL_RUN)
    suite = hang_finding(SimpleNamespace(stage="execution", root=tmp_path, block_on=BLOCK_ON), _child(), "The smoke call test suite", run="pytest")
    profiler, executor = parts(build_registry()["performance"]), parts(build_registry()["execution"])
    assert "did not finish" in (_skip_reason(profiler, report_with(smoke, stopped=True)) or "") and "nothing to profile" in (_skip_reason(profiler, report_with(smoke, stopped=True)) or "")
    assert _skip_reason(profiler, report_with(suite, stopped=False)) is None
    assert _skip_reason(executor, report_with(smoke, stopped=True)) is None  # a stage that does not run the function


def _ids(report: dict[str, Any]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for stage in report["stages"]:
        for f in stage["findings"]:
            found.setdefault(f["category"], []).append(f["id"])
    return {category: sorted(ids) for category, ids in found.items()}


def _crash_line(report: dict[str, Any]) -> int:
    [crash] = [f for s in report["stages"] for f in s["findings"] if f["category"] == "entrypoint-crash"]
    return crash["location"]["line"]


def test_finding_ids_survive_lines_inserted_above_the_defects(tmp_path: Path, shared_gate: Callable[..., tuple[GateRun, float]]) -> None:
    target = tmp_path / "target"
    shutil.copytree(TARGETS / "exec_defects", target)
    # Before the edit: the copy is the fixture as it is, so the session's run of it (the one
    # tests/test_execution.py reads) is the run before.
    before, _ = shared_gate("exec_defects", "--stages", "execution")
    assert before.returncode == 1, before.stderr

    crash_line = line_of(target / "train_loop.py", "planted: KeyError")
    lines = (target / "train_loop.py").read_text().splitlines(keepends=True)
    lines.insert(crash_line - 1, "# a comment and a blank line, added above the defect\n\n")
    (target / "train_loop.py").write_text("".join(lines))
    test_file = target / "tests" / "test_model.py"
    test_file.write_text("# moved down by a line\n" + test_file.read_text())
    after = run_gate(target, tmp_path / "after", "--stages", "execution")
    assert after.returncode == 1, after.stderr

    assert {"entrypoint-crash", "test-failure"} <= set(_ids(before.report))
    assert _ids(after.report) == _ids(before.report)
    assert _crash_line(after.report) == _crash_line(before.report) + 2


def test_baseline_metrics_are_matched_on_their_ids_not_their_labels(tmp_path: Path) -> None:
    now = [
        Metric(id="tests.passed", name="tests_passed", value=12),
        Metric(id="pytest.duration_s", name="pytest_duration_s", value=3.0, unit="s"),
    ]
    base = report_builders.report([report_builders.stage("execution", metrics=[
        Metric(id="tests.passed", name="passing tests", value=10),  # the label was reworded since
        Metric(id="pytest.wall_s", name="pytest_duration_s", value=2.0),  # same label, another metric
    ])]).model_dump(mode="json")
    request = RunRequest(root=tmp_path, task="T", version="v2", stages=["execution"], out=tmp_path, device="cpu", baseline=base, baseline_path="b.json")
    stage = StageReport(name="execution", status=StageStatus.PASSED, score=100, duration_s=1.0, summary="", metrics=now)
    comparison = compare_baseline(request, [stage])
    assert comparison is not None
    assert comparison.metric_deltas == [
        {"stage": "execution", "metric": "tests_passed", "metric_id": "tests.passed", "unit": "", "baseline": 10, "current": 12}
    ]


def test_python_dash_m_keeps_the_exit_status() -> None:
    """`python -m traingate` answers with the command's exit status (a BLOCK must not read as 0)."""
    done = subprocess.run([sys.executable, "-m", "traingate", "explain", "memory-leek"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 2 and "memory-leek" in done.stderr
