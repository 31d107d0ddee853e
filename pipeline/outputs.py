"""What `traingate run` writes and prints for people and CI systems (`--format`).

- `md`: report.md and one <stage>.md per stage; `json`: report.json; `sarif`: report.sarif;
  `junit`: report.junit.xml; `github`: workflow-command annotations on stdout (also on
  whenever `GITHUB_ACTIONS=true`). report.json is written whatever `--format` says: it is the
  record `--baseline` and every later tool reads.
- When `$GITHUB_STEP_SUMMARY` names a file, a compact summary is appended to it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from traingate.pipeline.gitinfo import rev_parse
from traingate.pipeline.lifecycle import write_atomic
from traingate.pipeline.rules import RULES
from traingate.pipeline.schema import PipelineReport
from traingate.reports import render_report_md, render_stage_md
from traingate.reports.facts import RunFacts
from traingate.reports.github import render_annotations
from traingate.reports.junit import render_junit
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
    return RunFacts(target_prefix="" if prefix == "." else prefix, config_file=config, rules=RULES)


@dataclass
class Written:
    files: list[Path]
    annotations: str  # workflow commands for stdout, "" unless `github` is on
    step_summary: Path | None  # the file the summary was appended to


def write_reports(report: PipelineReport, out: Path, formats: list[str], facts: RunFacts, env: Mapping[str, str] = os.environ) -> Written:
    """Each file appears whole or not at all; report.json, the one CI reads, comes last."""
    files: dict[str, Callable[[], str]] = {}
    if "md" in formats:
        for stage in report.stages:
            files[f"{stage.name}.md"] = partial(render_stage_md, report, stage)
        files["report.md"] = partial(render_report_md, report)
    if "sarif" in formats:
        files["report.sarif"] = partial(render_sarif, report, facts)
    if "junit" in formats:
        files["report.junit.xml"] = partial(render_junit, report, facts)
    files["report.json"] = partial(_report_json, report)
    written = []
    for name, render in files.items():
        write_atomic(out / name, render())
        written.append(out / name)
    summary_file = append_step_summary(report, facts, env)
    annotations = render_annotations(report, facts) if "github" in formats else ""
    return Written(written, annotations, summary_file)


def _report_json(report: PipelineReport) -> str:
    return report.model_dump_json(indent=2) + "\n"


def append_step_summary(report: PipelineReport, facts: RunFacts, env: Mapping[str, str]) -> Path | None:
    target = env.get("GITHUB_STEP_SUMMARY")
    if not target:
        return None
    path = Path(target)
    try:
        with path.open("a", encoding="utf-8") as handle:
            handle.write(render_step_summary(report, facts))
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
