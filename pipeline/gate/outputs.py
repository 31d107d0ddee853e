"""What `traingate run` writes and prints for people and CI systems (`--format`).

- `md`: report.md and one <stage>.md per stage; `json`: report.json; `sarif`: report.sarif;
  `junit`: report.junit.xml; `github`: workflow-command annotations on stdout (also on
  whenever `GITHUB_ACTIONS=true`). report.json is written whatever `--format` says: it is the
  record `--baseline` and every later tool reads, and it is written first: a renderer that
  fails leaves it and the other outputs written, and report.md becomes a minimal report.
- When `$GITHUB_STEP_SUMMARY` names a file, a compact summary is appended to it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from traingate.pipeline.gate.gitinfo import rev_parse
from traingate.pipeline.supervision.lifecycle import write_atomic
from traingate.pipeline.model.registry import build_registry, parts, rule_table
from traingate.pipeline.model.schema import PipelineReport
from traingate.reports import render_report_md, render_stage_md
from traingate.reports.facts import RunFacts, StagePage
from traingate.reports.github import render_annotations
from traingate.reports.junit import render_junit
from traingate.reports.minimal import render_minimal_md
from traingate.reports.sarif import render_sarif
from traingate.reports.step_summary import render_step_summary

FORMATS = ("md", "json", "sarif", "github", "junit")
DEFAULT_FORMATS = "md,json"
CONFIG_FILES = ("traingate.toml", "pyproject.toml")  # the order the configuration is looked for in


class FormatError(ValueError):
    """`--format` names something this version cannot write."""


def parse_formats(option: str | None, env: Mapping[str, str] = os.environ) -> list[str]:
    """The formats asked for, in FORMATS order; `github` is added on GitHub Actions."""
    asked = [name.strip().lower() for name in (option or DEFAULT_FORMATS).split(",") if name.strip()]
    unknown = [name for name in asked if name not in FORMATS]
    if unknown or not asked:
        raise FormatError(f"unknown format(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(FORMATS)}")
    if env.get("GITHUB_ACTIONS") == "true":
        asked.append("github")
    return [name for name in FORMATS if name in asked]


def repository_root(target: Path) -> Path | None:
    top = rev_parse(target, "--show-toplevel")
    return Path(top).resolve() if top else None


def run_facts(target: Path) -> RunFacts:
    """Where the target sits in its repository (paths in CI outputs are relative to the repository's root)."""
    target = target.resolve()
    top = repository_root(target)
    prefix = target.relative_to(top).as_posix() if top is not None and target.is_relative_to(top) else ""
    config = next((name for name in CONFIG_FILES if (target / name).is_file()), None)
    return RunFacts(target_prefix="" if prefix == "." else prefix, config_file=config, rules=rule_table().rules, pages=stage_pages())


def stage_pages() -> dict[str, StagePage]:
    """Each registered stage's page: its details model and template."""
    return {name: StagePage(found.details_model, found.template) for name, stage in build_registry().items() for found in [parts(stage)]}


@dataclass
class Written:
    files: list[Path]
    annotations: str  # workflow commands for stdout, "" unless `github` is on
    step_summary: Path | None  # the file the summary was appended to
    failures: list[tuple[str, str]] = field(default_factory=list)  # (output, why) of each renderer that failed
    minimal_md: bool = False  # report.md is the minimal report that names them


def write_reports(report: PipelineReport, out: Path, formats: list[str], facts: RunFacts, env: Mapping[str, str] = os.environ) -> Written:
    """report.json first, then each other output whole or not at all. A renderer that fails
    leaves the others written; report.md is then the minimal report that says which failed
    and why (docs/contract.md, "Exit status"). Only report.json's own write may raise."""
    record = _report_json(report)
    write_atomic(out / "report.json", record)
    data = json.loads(record)
    written = Written([out / "report.json"], "", None)
    for name, render in _file_renderers(report, formats, facts).items():
        text = _attempt(written, name, render)
        if text is not None:
            write_atomic(out / name, text)
            written.files.append(out / name)
    summary = _attempt(written, "step summary", partial(render_step_summary, report, facts)) if env.get("GITHUB_STEP_SUMMARY") else None
    written.step_summary = append_step_summary(summary, env) if summary is not None else None
    if "github" in formats:
        written.annotations = _attempt(written, "github annotations", partial(render_annotations, report, facts)) or ""
    if written.failures and "md" in formats:
        write_atomic(out / "report.md", render_minimal_md(data, written.failures))
        written.minimal_md = True
        if out / "report.md" not in written.files:
            written.files.append(out / "report.md")
    return written


def _file_renderers(report: PipelineReport, formats: list[str], facts: RunFacts) -> dict[str, Callable[[], str]]:
    files: dict[str, Callable[[], str]] = {}
    if "md" in formats:
        for stage in report.stages:
            files[f"{stage.name}.md"] = partial(render_stage_md, report, stage, facts.pages.get(stage.name))
        files["report.md"] = partial(render_report_md, report)
    if "sarif" in formats:
        files["report.sarif"] = partial(render_sarif, report, facts)
    if "junit" in formats:
        files["report.junit.xml"] = partial(render_junit, report, facts)
    return files


def _attempt(written: Written, output: str, render: Callable[[], str]) -> str | None:
    """One renderer's text, or None when it failed: the failure (its output and why) is recorded, not raised."""
    try:
        return render()
    except Exception as exc:  # noqa: BLE001 - any renderer bug: the verdict is still written
        written.failures.append((output, f"{type(exc).__name__}: {exc}"))
        return None


def _report_json(report: PipelineReport) -> str:
    return report.model_dump_json(indent=2) + "\n"


def append_step_summary(text: str, env: Mapping[str, str]) -> Path | None:
    """Append the rendered summary to `$GITHUB_STEP_SUMMARY`; the file it went to, if any."""
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(text)
    except OSError:
        return None  # a summary is a courtesy; the reports and the exit status are what count
    return path


def display_path(path: Path, cwd: Path | None = None) -> str:
    """`path` relative to the current folder when it lies inside it, else as given."""
    try:
        base = (cwd or Path.cwd()).resolve()
        relative = path.resolve().relative_to(base)
    except (ValueError, OSError):
        return str(path)
    return relative.as_posix() or "."
