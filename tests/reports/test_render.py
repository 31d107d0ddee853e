"""A report is always written, and reads clean (docs/contract.md, "Exit status" and "Reports").

Every template renders details in which any optional part is missing, None or empty, and the
largest details the fixture targets' runs recorded (tests/schemas/); target text with escape
sequences, line breaks and pipes never breaks a table row or a title; a renderer that fails
leaves report.json, the other outputs, a minimal report.md and the decision's exit status; an
internal error of the gate is exit status 3, one line on stderr and a log file."""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from tests.conftest import cli_in_process
from tests.details_strategies import NASTY_TEXT, bare, model_data
from tests.markdown_tables import report_folder_problems, table_problems
from tests.report_builders import measured, report, stage, write
from tests.paths import SCHEMAS
from traingate.pipeline.gate import outputs
from traingate.pipeline.model.findings import finding
from traingate.pipeline.gate.outputs import write_reports
from traingate.pipeline.gate.outputs import stage_pages
from traingate.pipeline.model.registry import rule_table
from traingate.pipeline.model.schema import Evidence, EvidenceKind, Location, Metric, PipelineReport, Severity, StageReport
from traingate.reports.facts import RunFacts
from traingate.reports import render
from traingate.reports.render import render_report_md, render_stage_md, render_summary, table_cell
from traingate.reports.github import render_annotations
from traingate.reports.junit import render_junit
from traingate.reports.minimal import render_minimal_md
from traingate.reports.sarif import render_sarif
from traingate.reports.step_summary import render_step_summary
from traingate.stages.performance.rules import HOST_SYNC
from traingate.stages.shared_categories import ENTRYPOINT_CRASH

PAGES = stage_pages()
STAGE_DETAILS = {name: page.details_model for name, page in PAGES.items() if page.details_model is not None}
FACTS = RunFacts(target_prefix="", config_file=None, rules=rule_table().rules, pages=PAGES)


def nasty_finding(stage_name: str, text: str) -> Any:
    return finding(
        stage=stage_name, category=ENTRYPOINT_CRASH, severity=Severity.CRITICAL, title=f"crash: {text}",
        location=Location(path=f"src/{text}.py", line=3, function=text), problem=text,
        evidence=Evidence(kind=EvidenceKind.OBSERVED, summary=text, traceback=text), block_on={Severity.CRITICAL}, key=text,
    )


def stage_with(name: str, details: dict[str, Any], text: str = "ran") -> StageReport:
    metrics = [Metric(id="m", name=f"metric {text}", value=1.5, unit=text, note=text)]
    one = stage(name, [nasty_finding(name, text)], metrics)
    return one.model_copy(update={"details": details, "summary": f"{name}: {text}"})


def render_all(one: StageReport) -> list[str]:
    """Every renderer over a report holding `one`; each must return (the markdown ones' texts)."""
    whole = report([one])
    texts = [render_stage_md(whole, one, PAGES.get(one.name)), render_report_md(whole), render_step_summary(whole, FACTS)]
    texts.append(render_minimal_md(json.loads(whole.model_dump_json()), [("report.md", "TypeError: x\n\x1b[1my\x1b[0m")]))
    assert render_sarif(whole, FACTS) and render_junit(whole, FACTS) and render_annotations(whole, FACTS)
    summary = render_summary(whole)
    assert "\x1b" not in summary and all(line.startswith(("traingate", "  ", "Decision")) for line in summary.splitlines())
    return texts


def assert_clean(texts: list[str]) -> None:
    problems = [p for text in texts for p in table_problems(text)]
    assert not problems, "\n".join(problems)


def _parts(model: type[BaseModel]) -> list[tuple[str, type[BaseModel]]]:
    """Each top-level part of a details model, once for each model it may be."""
    found = []
    for name, field in model.model_fields.items():
        for arg in typing.get_args(field.annotation) or (field.annotation,):
            inner = typing.get_args(arg)[-1] if typing.get_origin(arg) in (list, dict) else arg
            if isinstance(inner, type) and issubclass(inner, BaseModel):
                found.append((field.alias or name, inner))
    return found


BARE_PARTS = [
    pytest.param(stage_name, part, member, id=f"{stage_name}-{part}-{member.__name__}")
    for stage_name, model in STAGE_DETAILS.items()
    for part, member in _parts(model)
]


@pytest.mark.parametrize("stage_name", [*STAGE_DETAILS, "unknown"])
def test_a_stage_without_details_renders(stage_name: str) -> None:
    assert_clean(render_all(stage_with(stage_name, {})))


def test_loaded_templates_render_every_page_without_reading_one_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gate server loads every template once (`load_templates`): the runs it forks render
    every page and format from what it loaded."""
    render.load_templates(PAGES.values())

    def read_again(_env: Any, name: str, *_: Any) -> Any:
        raise AssertionError(f"template {name} read again")

    monkeypatch.setattr(render._env().loader, "load", read_again)
    for stage_name in [*STAGE_DETAILS, "unknown"]:
        assert_clean(render_all(stage_with(stage_name, {})))


@pytest.mark.parametrize(("stage_name", "part", "member"), BARE_PARTS)
def test_a_part_with_every_optional_field_missing_renders(stage_name: str, part: str, member: type[BaseModel]) -> None:
    model = STAGE_DETAILS[stage_name]
    annotation = model.model_fields[next(n for n, f in model.model_fields.items() if (f.alias or n) == part)].annotation
    container = typing.get_origin(annotation)
    value: Any = [bare(member)] if container is list else {"fp32": bare(member)} if container is dict else bare(member)
    details = model.model_validate({part: value}).model_dump(mode="json", by_alias=True, exclude_unset=True)
    assert_clean(render_all(stage_with(stage_name, details)))


def _recorded() -> list[Any]:
    samples = json.loads((SCHEMAS / "stage_details.json").read_text())
    performance = json.loads((SCHEMAS / "performance_details.json").read_text())
    cases = [pytest.param(name, s["details"], id=f"{name}-{s['run']}") for name, runs in samples.items() for s in runs]
    return cases + [pytest.param("performance", details, id=f"performance-{run}") for run, details in performance.items()]


@pytest.mark.parametrize(("stage_name", "details"), _recorded())
def test_the_details_fixture_runs_recorded_render_clean(stage_name: str, details: dict[str, Any]) -> None:
    assert_clean(render_all(stage_with(stage_name, details, text=NASTY_TEXT[1])))


def test_a_loader_without_a_wait_share_renders() -> None:
    # The forum-84911 reproduction: a DataLoader fed the steps, but no step had a wait share.
    details = json.loads((SCHEMAS / "performance_details.json").read_text())["perf_clean_amp"]
    details["stall"].update(median_share=None, steps=0)
    markdown = render_stage_md(report([one := stage_with("performance", details)]), one, PAGES["performance"])
    assert "median wait share not measured" in markdown


@pytest.mark.parametrize("stage_name", list(STAGE_DETAILS))
@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large])
@given(data=st.data(), text=st.sampled_from(NASTY_TEXT))
def test_generated_details_never_break_rendering(stage_name: str, data: st.DataObject, text: str) -> None:
    model = STAGE_DETAILS[stage_name]
    drawn = data.draw(model_data(model))
    try:
        model.model_validate(drawn)
    except ValidationError:
        reject()  # a shape the model refuses never reaches a template
    assert_clean(render_all(stage_with(stage_name, drawn, text=text)))


@given(text=st.text(alphabet=st.sampled_from(["a", " ", "|", "\\", "\x1b", "[", "1", "m", "\n", "\r", "\x07", "]", "\u2028", "\x9b"]), max_size=30))
def test_a_cell_holds_no_control_character_line_break_or_bare_pipe(text: str) -> None:
    cell = table_cell(text)
    assert not table_problems(f"| a |\n|---|\n| {cell} |\n")


def test_the_cell_filter_drops_escape_sequences_and_joins_lines() -> None:
    assert table_cell("\x1b[1mKeyError\x1b[0m: 'a|b'\r\nsecond\tline\x1b]0;title\x07") == "KeyError: 'a\\|b' second line"


# -- a renderer that fails ----------------------------------------------------------------


def _parts_to_merge(tmp_path: Path) -> list[str]:
    sync = measured("performance", HOST_SYNC, Severity.HIGH, "loop.py", "loss.item()")
    whole = report([stage("execution"), stage("performance", [sync]), stage("concurrency"), stage("correctness")])
    return [str(write(whole, tmp_path / "part" / "report.json"))]


def _broken(*_: Any) -> str:
    raise TypeError("unsupported operand type(s) for *: 'NoneType' and 'int'")


def test_a_broken_renderer_leaves_the_json_a_minimal_report_and_the_decision(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outputs, "render_report_md", _broken)
    monkeypatch.setattr("traingate.pipeline.gate.cli.render_summary", _broken)
    out = tmp_path / "merged"
    done = cli_in_process("merge", *_parts_to_merge(tmp_path), "--out", str(out), "--format", "md,json,sarif,junit")
    assert done.returncode == 1  # the decision's: BLOCK
    merged = PipelineReport.model_validate_json((out / "report.json").read_text())
    assert merged.decision.value == "BLOCK"
    for other in ("report.sarif", "report.junit.xml", "performance.md", "execution.md"):
        assert (out / other).is_file(), other
    minimal = (out / "report.md").read_text()
    assert "**Decision: BLOCK**" in minimal and f"score {merged.score}/100" in minimal
    assert "- **report.md** failed: TypeError: unsupported operand type(s) for *: 'NoneType' and 'int'" in minimal
    assert "| performance | blocked |" in minimal and "`host-sync` at `loop.py:3`" in minimal and "**blocking**" in minimal
    assert not report_folder_problems(out)
    failed = [line for line in done.stderr.splitlines() if "the report.md renderer failed" in line]
    assert len(failed) == 1 and "(TypeError: unsupported operand" in failed[0] and "minimal report" in failed[0]
    assert "Traceback" not in done.stderr
    assert "the terminal summary renderer failed (TypeError" in done.stderr and "Decision: BLOCK" in done.stdout


def test_every_renderer_failing_still_writes_the_json_and_a_minimal_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("render_report_md", "render_stage_md", "render_sarif", "render_junit", "render_annotations", "render_step_summary"):
        monkeypatch.setattr(outputs, name, _broken)
    whole = report([stage("execution")])
    summary = tmp_path / "summary.md"
    written = write_reports(whole, tmp_path, ["md", "json", "sarif", "github", "junit"], FACTS, env={"GITHUB_STEP_SUMMARY": str(summary)})
    assert sorted(output for output, _ in written.failures) == sorted(
        ["execution.md", "report.md", "report.sarif", "report.junit.xml", "step summary", "github annotations"]
    )
    assert written.minimal_md and written.annotations == "" and not summary.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]
    assert PipelineReport.model_validate_json((tmp_path / "report.json").read_text()).decision.value == "PASS"
    assert "**Decision: PASS**" in (tmp_path / "report.md").read_text()


def test_an_internal_error_is_exit_status_3_one_line_and_a_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*_: Any, **__: Any) -> Any:
        raise RuntimeError("the gate's own bug")

    monkeypatch.setattr("traingate.pipeline.gate.cli.write_reports", crash)
    out = tmp_path / "merged"
    done = cli_in_process("merge", *_parts_to_merge(tmp_path), "--out", str(out))
    assert done.returncode == 3
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("traingate: internal error: RuntimeError: the gate's own bug (no verdict;")
    log = out / "traingate-error.log"
    assert str(log.name) in done.stderr
    assert log.read_text().startswith("Traceback (most recent call last):") and "RuntimeError: the gate's own bug" in log.read_text()
