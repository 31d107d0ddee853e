"""CI outputs: SARIF, GitHub annotations, the step summary, JUnit XML, the report.md size cap,
the GitHub Action and the example CI jobs, each checked against its schema or parser."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from junitparser import Error as JUnitError
from junitparser import Failure, JUnitXml, Skipped
from ruamel.yaml import YAML  # check-jsonschema's own YAML reader

from tests.conftest import REPO, TARGETS, TRAINGATE, cli_env, line_of
from tests.paths import SCHEMAS
from traingate.pipeline.gate.outputs import DEFAULT_FORMATS, FormatError, display_path, parse_formats, run_facts, write_reports
from traingate.pipeline.gate.outputs import stage_pages
from traingate.pipeline.model.registry import rule_table
from traingate.pipeline.model.schema import (
    Category,
    Decision,
    Environment,
    Evidence,
    EvidenceKind,
    Finding,
    Location,
    PipelineReport,
    Severity,
    StageReport,
    StageStatus,
    TargetInfo,
)
from traingate.reports import render_report_md, render_stage_md
from traingate.reports.clip import REPORT_MD_LIMIT
from traingate.reports.facts import RunFacts
from traingate.reports.github import escape_data, escape_property, render_annotations
from traingate.reports.junit import render_junit
from traingate.reports.sarif import render_sarif
from traingate.reports.step_summary import render_step_summary
from traingate.stages.execution.rules import ENTRYPOINT_UNTESTED, NO_TESTS, SKIPPED_TESTS, TEST_FAILURE
from traingate.stages.performance.rules import INPUT_STALL
from traingate.stages.shared_categories import ENTRYPOINT_CRASH

RULES = rule_table().rules

SARIF_SCHEMA = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
BLOCK_ON = {Severity.CRITICAL, Severity.HIGH}
ANNOTATION = re.compile(r"^::(error|warning|notice) ([^:]*)::(.*)$")
CHECK_JSONSCHEMA = str(Path(sys.executable).with_name("check-jsonschema"))
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


# --- building reports -------------------------------------------------------------------------


def finding(
    category: Category = TEST_FAILURE,
    severity: Severity = Severity.HIGH,
    path: str | None = "utils/tier3_training_utilities.py",
    line: int | None = 265,
    key: str = "k",
    stage: str = "execution",
    title: str = "a finding",
    evidence: Evidence | None = None,
) -> Finding:
    return Finding.create(
        stage=stage, category=category, severity=severity, title=title,
        location=Location(path=path, line=line, function="test_fine_tuning") if path else None,
        problem=f"the problem of {title}", impact="the impact", fix="the fix",
        evidence=evidence or Evidence(kind=EvidenceKind.OBSERVED, summary="seen"), block_on=BLOCK_ON, key=key,
    )


def stage(name: str, findings: list[Finding], status: StageStatus | None = None, skipped: str | None = None) -> StageReport:
    if status is None:
        status = StageStatus.BLOCKED if any(f.blocking for f in findings) else StageStatus.PASSED
    return StageReport(
        name=name, status=status, score=None if status is StageStatus.SKIPPED else 60, duration_s=1.5,
        summary=f"{name} summary", skipped_reason=skipped, findings=findings,
    )


def report(*stages: StageReport, decision: Decision | None = None) -> PipelineReport:
    blocking = any(f.blocking for s in stages for f in s.findings)
    return PipelineReport(
        tool_version="0.0.0", task="T035", version="v7", target=TargetInfo(path="/somewhere/examples/amp-trainer"),
        environment=Environment(python="3.11", torch="2.13", device="cpu", device_name="cpu"),
        started_at="2026-01-01T00:00:00+00:00", duration_s=12.0,
        decision=decision or (Decision.BLOCK if blocking else Decision.PASS), score=40 if blocking else 100, stages=list(stages),
    )


def mixed_report() -> PipelineReport:
    crash = finding(ENTRYPOINT_CRASH, Severity.CRITICAL, key="crash", title="crash, with: punctuation")
    failure = finding(TEST_FAILURE, Severity.HIGH, path="tests/test_a.py", line=3, key="fail", title="test fails")
    skipped = finding(SKIPPED_TESTS, Severity.LOW, path="tests/test_a.py", line=9, key="skip", title="skipped")
    no_tests = finding(NO_TESTS, Severity.HIGH, path=None, line=None, key="none", title="no test ran")
    stall = finding(INPUT_STALL, Severity.MEDIUM, stage="performance", key="stall", title="input stall")
    return report(
        stage("execution", [crash, failure, skipped, no_tests]),
        stage("performance", [stall]),
        stage("concurrency", [], status=StageStatus.SKIPPED, skipped="no entrypoint configured"),
    )


def git_repo_with_target(root: Path) -> Path:
    """A git repository whose target lives in the subfolder examples/amp-trainer."""
    target = root / "examples" / "amp-trainer"
    (target / "utils").mkdir(parents=True)
    (target / "pyproject.toml").write_text('[tool.traingate]\ntask = "T035"\n')
    (target / "utils" / "tier3_training_utilities.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return target


def validate_sarif(document: dict[str, Any]) -> None:
    validator = jsonschema.Draft4Validator(SARIF_SCHEMA, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER)
    errors = sorted(validator.iter_errors(document), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{list(e.path)}: {e.message[:300]}" for e in errors[:10])


def load_yaml(path: Path) -> Any:
    return YAML(typ="safe").load(path.read_text())


def dump_yaml(document: Any, path: Path) -> None:
    YAML(typ="safe").dump(document, path)


def annotations(text: str) -> list[tuple[str, dict[str, str], str]]:
    parsed = []
    for line in text.splitlines():
        match = ANNOTATION.match(line)
        assert match, f"not a workflow command: {line!r}"
        props = dict(item.split("=", 1) for item in match.group(2).split(",")) if match.group(2) else {}
        parsed.append((match.group(1), props, match.group(3)))
    return parsed


# --- run facts --------------------------------------------------------------------------------


@needs_git
def test_facts_of_a_target_in_a_git_subfolder(tmp_path: Path) -> None:
    target = git_repo_with_target(tmp_path / "repo")
    facts = run_facts(target)
    assert facts.target_prefix == "examples/amp-trainer"
    assert facts.config_file == "pyproject.toml"
    assert facts.repo_path("utils/x.py") == "examples/amp-trainer/utils/x.py"
    assert facts.anchor_file() == "examples/amp-trainer/pyproject.toml"
    assert facts.rules == RULES


def test_facts_of_a_target_outside_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "plain"
    target.mkdir()
    # git looks no higher than tmp_path, wherever the temporary folder lies.
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    facts = run_facts(target)
    assert facts.repo_path("utils/x.py") == "utils/x.py" and facts.config_file is None and facts.anchor_file() is None


# --- SARIF ------------------------------------------------------------------------------------


@needs_git
def test_sarif_is_valid_and_paths_are_relative_to_the_repository_root(tmp_path: Path) -> None:
    facts = run_facts(git_repo_with_target(tmp_path / "repo"))
    rep = mixed_report()
    document = json.loads(render_sarif(rep, facts))
    validate_sarif(document)
    [run] = document["runs"]
    rules = run["tool"]["driver"]["rules"]
    # One SARIF rule per rule of the table, in its order: GradScaler's protocol rules each have their own.
    assert [r["id"] for r in rules] == [rule.id for rule in RULES]
    assert "gradscaler-protocol/missing-update" in {r["id"] for r in rules}
    by_id = {r["id"]: r for r in rules}
    crash_rule = next(rule for rule in RULES if rule.category is ENTRYPOINT_CRASH)
    assert by_id["entrypoint-crash"]["shortDescription"]["text"] == crash_rule.description
    assert crash_rule.check in by_id["entrypoint-crash"]["fullDescription"]["text"]
    assert crash_rule.fix in by_id["entrypoint-crash"]["help"]["text"]

    results = run["results"]
    assert len(results) == len(rep.findings())
    for result in results:
        assert rules[result["ruleIndex"]]["id"] == result["ruleId"]
    by_rule = {r["ruleId"]: r for r in results}
    crash = by_rule["entrypoint-crash"]
    location = crash["locations"][0]["physicalLocation"]
    assert location["artifactLocation"]["uri"] == "examples/amp-trainer/utils/tier3_training_utilities.py"
    assert location["region"] == {"startLine": 265}
    assert crash["level"] == "error" and crash["properties"]["blocking"] is True
    [original] = [f for f in rep.findings() if f.category is ENTRYPOINT_CRASH]
    assert crash["partialFingerprints"] == {"traingate/v1": original.id}
    assert by_rule["skipped-tests"]["level"] == "note"
    assert by_rule["input-stall"]["level"] == "warning"
    # A finding without a location is still a result, anchored on the configuration file.
    anchored = by_rule["no-tests"]["locations"][0]["physicalLocation"]
    assert anchored["artifactLocation"]["uri"] == "examples/amp-trainer/pyproject.toml"
    # Worst first: the blocking critical finding leads.
    assert results[0]["ruleId"] == "entrypoint-crash"


def test_sarif_without_a_repository_or_configuration_anchors_on_the_target_folder() -> None:
    facts = RunFacts(rules=())
    document = json.loads(render_sarif(mixed_report(), facts))
    validate_sarif(document)
    uris = {r["ruleId"]: r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in document["runs"][0]["results"]}
    assert uris["entrypoint-crash"] == "utils/tier3_training_utilities.py"
    assert uris["no-tests"] == "."
    assert "ruleIndex" not in document["runs"][0]["results"][0]


def test_the_sarif_schema_copy_rejects_what_it_should() -> None:
    """The validation above means something: the schema copy catches a malformed log."""
    document = json.loads(render_sarif(mixed_report(), RunFacts()))
    document["runs"][0]["results"][0]["level"] = "fatal"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, SARIF_SCHEMA, cls=jsonschema.Draft4Validator)


# --- GitHub annotations -----------------------------------------------------------------------


def test_workflow_command_escaping() -> None:
    assert escape_data("100% done\r\nnext: a, b") == "100%25 done%0D%0Anext: a, b"
    assert escape_property("100% done\r\nnext: a, b") == "100%25 done%0D%0Anext%3A a%2C b"


@needs_git
def test_annotations_are_worst_first_escaped_and_repository_relative(tmp_path: Path) -> None:
    facts = run_facts(git_repo_with_target(tmp_path / "repo"))
    lines = annotations(render_annotations(mixed_report(), facts))
    kinds = [kind for kind, _, _ in lines]
    assert kinds == ["error", "error", "error", "warning", "notice"]
    first_kind, first_props, first_message = lines[0]
    assert first_props["file"] == "examples/amp-trainer/utils/tier3_training_utilities.py" and first_props["line"] == "265"
    # The title holds ':' and ',' (escaped) and the message newlines (escaped).
    assert "%2C with%3A punctuation" in first_props["title"] and "entrypoint-crash" in first_props["title"]
    assert "%0A" in first_message and "\n" not in first_message
    no_tests = next(props for _, props, message in lines if "no-tests" in props["title"])
    assert no_tests["file"] == "examples/amp-trainer/pyproject.toml" and "line" not in no_tests


def test_annotations_respect_githubs_ten_per_type_and_say_what_was_left_out() -> None:
    blocking = [finding(TEST_FAILURE, Severity.HIGH, key=f"b{i}", title=f"fail {i}") for i in range(11)]
    blocking.append(finding(ENTRYPOINT_CRASH, Severity.CRITICAL, key="c", title="crash"))
    warnings = [finding(ENTRYPOINT_UNTESTED, Severity.MEDIUM, key=f"w{i}") for i in range(12)]
    notices = [finding(SKIPPED_TESTS, Severity.LOW, key=f"n{i}") for i in range(12)]
    lines = annotations(render_annotations(report(stage("execution", blocking + warnings + notices)), RunFacts()))
    kinds = [kind for kind, _, _ in lines]
    assert kinds == ["error"] * 10 + ["warning"] * 10 + ["notice"] * 10
    assert "crash" in lines[0][1]["title"]  # the critical one first
    *_, (_, props, message) = lines
    assert "more findings" in props["title"]
    # 2 errors, 2 warnings and 3 notices (one notice place went to this summary) were left out.
    assert message.startswith("7 more finding(s)") and "2 errors, 2 warnings, 3 notices" in message


def test_exactly_ten_notices_need_no_summary() -> None:
    notices = [finding(SKIPPED_TESTS, Severity.LOW, key=f"n{i}") for i in range(10)]
    lines = annotations(render_annotations(report(stage("execution", notices)), RunFacts()))
    assert [kind for kind, _, _ in lines] == ["notice"] * 10 and not any("more findings" in p.get("title", "") for _, p, _ in lines)


# --- step summary -----------------------------------------------------------------------------


@needs_git
def test_step_summary_is_compact_and_link_free(tmp_path: Path) -> None:
    facts = run_facts(git_repo_with_target(tmp_path / "repo"))
    text = render_step_summary(mixed_report(), facts)
    assert "traingate BLOCK" in text and "**Score** 40/100" in text
    assert "| execution | blocked | 60 | 4 | 3 | 1.5 s |" in text
    assert "| concurrency | skipped (no entrypoint configured) | — | 0 | 0 | 1.5 s |" in text
    assert "`examples/amp-trainer/utils/tier3_training_utilities.py:265`" in text
    blocking_rows = [line for line in text.split("**Blocking findings**")[1].splitlines() if line.startswith("| ") and "`" in line]
    assert len(blocking_rows) == 3 and "crash, with: punctuation" in blocking_rows[0]
    assert "](" not in text and "http" not in text and "<a " not in text
    assert len(text) < 5000


def test_step_summary_is_appended_and_default_formats_write_what_they_always_did(tmp_path: Path) -> None:
    rep = mixed_report()
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    out = tmp_path / "out"
    out.mkdir()
    written = write_reports(rep, out, parse_formats(None, env={}), RunFacts(), env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert summary.read_text().startswith("earlier step\n### ")
    assert "traingate BLOCK" in summary.read_text() and written.step_summary == summary
    assert sorted(p.name for p in out.iterdir()) == ["concurrency.md", "execution.md", "performance.md", "report.json", "report.md"]
    assert written.annotations == ""
    assert (out / "report.json").read_text() == rep.model_dump_json(indent=2) + "\n"
    assert (out / "report.md").read_text() == render_report_md(rep)
    assert (out / "execution.md").read_text() == render_stage_md(rep, rep.stages[0], stage_pages()["execution"])


def test_format_option() -> None:
    assert DEFAULT_FORMATS == "md,json"
    assert parse_formats(None, env={}) == ["md", "json"]
    assert parse_formats("junit, SARIF", env={}) == ["sarif", "junit"]
    assert parse_formats("md", env={"GITHUB_ACTIONS": "true"}) == ["md", "github"]
    with pytest.raises(FormatError, match="xml"):
        parse_formats("md,xml", env={})


def test_display_path(tmp_path: Path) -> None:
    assert display_path(tmp_path / "a" / "b", cwd=tmp_path) == "a/b"
    assert display_path(tmp_path, cwd=tmp_path / "elsewhere") == str(tmp_path)


# --- report.md size -------------------------------------------------------------------------


def test_report_md_fits_a_pull_request_comment_by_cutting_evidence_only() -> None:
    huge_data = {"call_sites": [{"site": f"train.py:{i}", "count": i, "stack": "frame\n" * 40} for i in range(4000)], "note": "x" * 200_000}
    huge_traceback = "Traceback (most recent call last):\n" + "  frame line\n" * 50_000 + "KeyError: 'train_data'\n"
    findings = [
        finding(ENTRYPOINT_CRASH, Severity.CRITICAL, key=f"c{i}", title=f"crash number {i}",
                evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="s" * 20_000, traceback=huge_traceback, data=huge_data))
        for i in range(5)
    ]
    small = finding(SKIPPED_TESTS, Severity.LOW, key="small", title="small one",
                    evidence=Evidence(kind=EvidenceKind.OBSERVED, summary="tiny", data={"reason": "CUDA not available"}))
    rep = report(stage("execution", [*findings, small]))
    text = render_report_md(rep)
    assert len(text) <= REPORT_MD_LIMIT
    for f in rep.findings():  # every finding is still there, whole apart from its evidence
        assert f.title in text and f.id in text and f.problem in text and f.fix in text
    assert "the whole text is in execution.md and report.json" in text
    assert "the whole data is in execution.md and report.json" in text
    assert text.count("KeyError: 'train_data'") == 5  # a traceback keeps its end
    assert '"reason": "CUDA not available"' in text  # small evidence is left whole
    # The stage report keeps everything.
    assert huge_traceback in render_stage_md(rep, rep.stages[0], stage_pages()["execution"])


def test_a_small_report_md_is_unchanged_by_the_cap() -> None:
    rep = mixed_report()
    assert render_report_md(rep) == render_report_md(rep, limit=10**9)


# --- JUnit XML ------------------------------------------------------------------------------


def test_junit_has_a_suite_per_stage_and_a_case_per_check(tmp_path: Path) -> None:
    error = finding(Category.STAGE_ERROR, Severity.CRITICAL, stage="performance", path=None, key="err", title="agent died")
    rep = mixed_report()
    rep = rep.model_copy(update={"stages": [rep.stages[0], stage("performance", [*rep.stages[1].findings, error], status=StageStatus.ERROR), rep.stages[2]]})
    path = tmp_path / "report.junit.xml"
    path.write_text(render_junit(rep, RunFacts(rules=run_facts(tmp_path).rules)))
    xml = JUnitXml.fromfile(str(path))
    suites = {suite.name: suite for suite in xml}
    assert list(suites) == ["execution", "performance", "concurrency"]
    owned = {name: [r.category.value for r in RULES if r.stage == name and not r.sub] for name in suites}

    execution = {case.name: case for case in suites["execution"]}
    assert list(execution) == owned["execution"]
    assert [type(r) for r in execution["test-failure"].result] == [Failure]
    assert [type(r) for r in execution["entrypoint-crash"].result] == [Failure]
    assert [type(r) for r in execution["no-tests"].result] == [Failure]
    assert execution["skipped-tests"].result == [] and "skipped" in (execution["skipped-tests"].system_out or "")
    assert execution["collection-error"].is_passed
    assert suites["execution"].failures == 3 and suites["execution"].tests == len(owned["execution"])

    performance = {case.name: case for case in suites["performance"]}
    assert list(performance) == [*owned["performance"], "stage-error"]  # a stage-independent check it reported
    assert [type(r) for r in performance["stage-error"].result] == [JUnitError]
    assert performance["input-stall"].is_passed and "input stall" in (performance["input-stall"].system_out or "")

    concurrency = list(suites["concurrency"])
    assert len(concurrency) == len(owned["concurrency"])
    assert all([type(r) for r in case.result] == [Skipped] for case in concurrency)
    assert concurrency[0].result[0].message == "no entrypoint configured"
    assert xml.failures == 3 and xml.errors == 1 and xml.skipped == len(owned["concurrency"])


def test_junit_survives_characters_xml_cannot_hold(tmp_path: Path) -> None:
    weird = finding(title="bad \x00 bytes \x1b[31m", key="weird")
    path = tmp_path / "r.xml"
    path.write_text(render_junit(report(stage("execution", [weird])), RunFacts()))
    [suite] = JUnitXml.fromfile(str(path))
    [case] = list(suite)
    assert case.result[0].message.startswith("bad \ufffd bytes")


# --- the GitHub Action and the example jobs ------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "path"),
    [
        ("vendor.github-actions", "action.yml"),
        ("vendor.github-workflows", "docs/examples/github-workflow.yml"),
        ("vendor.gitlab-ci", "docs/examples/gitlab-ci.yml"),
    ],
)
def test_ci_files_match_their_schemas(schema: str, path: str, tmp_path: Path) -> None:
    done = subprocess.run([CHECK_JSONSCHEMA, "--builtin-schema", schema, str(REPO / path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    # ... and the check can fail: the same file without its required top-level part does not pass.
    document = load_yaml(REPO / path)
    document.pop("runs" if "actions" in schema else "jobs" if "workflows" in schema else "traingate")
    if "gitlab" in schema:
        document["traingate"] = {"script": 42}
    broken = tmp_path / Path(path).name
    dump_yaml(document, broken)
    done = subprocess.run([CHECK_JSONSCHEMA, "--builtin-schema", schema, str(broken)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0


def test_the_action_runs_traingate_with_the_ci_formats_and_uploads() -> None:
    action = load_yaml(REPO / "action.yml")
    steps = action["runs"]["steps"]
    uses = [step.get("uses", "") for step in steps]
    assert any(u.startswith("actions/setup-python@") for u in uses)
    assert any(u.startswith("github/codeql-action/upload-sarif@") for u in uses)
    assert any(u.startswith("actions/upload-artifact@") for u in uses)
    gate = next(step for step in steps if step.get("id") == "gate")
    assert "--format md,json,sarif,github" in gate["run"]


def test_the_ci_page_shows_the_gitlab_job_as_kept_in_docs() -> None:
    job = (REPO / "docs" / "examples" / "gitlab-ci.yml").read_text()
    assert job.strip() in (REPO / "docs" / "ci.md").read_text()


# --- end to end ---------------------------------------------------------------------------------


@needs_git
@pytest.mark.slow
def test_end_to_end_every_format_validates(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    target = repo / "sub" / "exec_defects"
    shutil.copytree(TARGETS / "exec_defects", target)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    out = tmp_path / "out"
    summary = tmp_path / "step_summary.md"
    env = cli_env({k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")})
    env.update(GITHUB_STEP_SUMMARY=str(summary), NO_COLOR="1")
    done = subprocess.run(
        [*TRAINGATE, "run", str(target), "--out", str(out), "--stages", "execution", "--format", "md,json,sarif,github,junit"],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")) == [
        "execution.md", "report.json", "report.junit.xml", "report.md", "report.sarif",
    ]
    rep = PipelineReport.model_validate_json((out / "report.json").read_text())
    crash_line = line_of(target / "train_loop.py", "planted: KeyError")

    sarif = json.loads((out / "report.sarif").read_text())
    validate_sarif(sarif)
    crash = next(r for r in sarif["runs"][0]["results"] if r["ruleId"] == "entrypoint-crash")
    assert crash["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "sub/exec_defects/train_loop.py"
    assert crash["locations"][0]["physicalLocation"]["region"]["startLine"] == crash_line
    assert len(sarif["runs"][0]["results"]) == len(rep.findings())

    lines = annotations("\n".join(line for line in done.stdout.splitlines() if line.startswith("::")))
    assert [kind for kind, _, _ in lines][:2] == ["error", "error"]
    assert lines[0][1] == {**lines[0][1], "file": "sub/exec_defects/train_loop.py", "line": str(crash_line)}
    assert len(lines) == len(rep.findings())

    xml = JUnitXml.fromfile(str(out / "report.junit.xml"))
    [suite] = list(xml)
    failed = {case.name for case in suite if any(isinstance(r, Failure) for r in case.result)}
    assert failed == {f.category.value for f in rep.findings() if f.blocking} == {"entrypoint-crash", "test-failure"}

    assert len((out / "report.md").read_text()) <= REPORT_MD_LIMIT
    assert "traingate BLOCK" in summary.read_text() and "sub/exec_defects/train_loop.py" in summary.read_text()
    # Not a terminal and not --verbose: no progress lines; and never any colour.
    assert not re.search(r"^\[\d+/\d+\]", done.stdout, re.M)
    assert "\x1b[" not in done.stdout + done.stderr
    assert "Decision: BLOCK" in done.stdout


@pytest.mark.slow
def test_quiet_and_verbose(tmp_path: Path) -> None:
    env = cli_env({k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")})
    args = [*TRAINGATE, "run", str(TARGETS / "exec_defects"), "--stages", "execution"]
    quiet = subprocess.run([*args, "--out", str(tmp_path / "q"), "--quiet"], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert quiet.returncode == 1 and quiet.stdout == "", quiet.stdout + quiet.stderr
    assert (tmp_path / "q" / "report.json").is_file()
    verbose = subprocess.run(
        [*args, "--out", str(tmp_path / "v"), "--verbose"], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env,
    )
    assert verbose.returncode == 1, verbose.stdout + verbose.stderr
    assert "[1/1] execution ..." in verbose.stdout
    # Paths in messages are relative to the current folder when they lie inside it.
    assert "Wrote v/report.json" in verbose.stdout and "Reports: v\n" in verbose.stdout
    both = subprocess.run([*args, "--quiet", "--verbose"], capture_output=True, text=True, timeout=60, cwd=REPO, env=env)
    assert both.returncode == 2 and "not allowed with" in both.stderr


def _action_step(step_id_or_name: str) -> str:
    steps = load_yaml(REPO / "action.yml")["runs"]["steps"]
    return next(s["run"] for s in steps if step_id_or_name in (s.get("id"), s.get("name")))


@pytest.mark.slow
def test_the_actions_shell_steps_run_and_report_their_outputs(tmp_path: Path) -> None:
    """The action's own scripts, run as GitHub runs a composite step (bash -e -o pipefail)."""
    github_output = tmp_path / "github_output"
    env = cli_env({k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")})
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", GITHUB_OUTPUT=str(github_output),
        TARGET=str(TARGETS / "exec_defects"), STAGES="execution", DEVICE="cpu", POLICY="", BASELINE="", OUT=str(tmp_path / "out"),
    )
    bash = ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c"]
    done = subprocess.run([*bash, _action_step("gate")], capture_output=True, text=True, timeout=600, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout + done.stderr  # the verdict is acted on in the last step
    outputs = dict(line.split("=", 1) for line in github_output.read_text().splitlines())
    report_json = json.loads((tmp_path / "out" / "report.json").read_text())
    assert outputs == {"exit-code": "1", "decision": "BLOCK", "score": str(report_json["score"]), "sarif": f"{tmp_path}/out/report.sarif"}
    assert "::error file=" in done.stdout
    for status, fail_on_block, expected in (("1", "true", 1), ("1", "false", 0), ("0", "true", 0), ("2", "false", 2), ("", "true", 2)):
        decided = subprocess.run([*bash, _action_step("Decision")], env={**env, "STATUS": status, "FAIL_ON_BLOCK": fail_on_block}, timeout=60)
        assert decided.returncode == expected, (status, fail_on_block)
