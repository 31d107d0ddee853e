"""Markdown and terminal renderers. Templates receive only the report (and one stage of it)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import BaseLoader, ChoiceLoader, Environment, FileSystemBytecodeCache, PackageLoader, StrictUndefined, TemplateNotFound
from jinja2.bccache import Bucket

from traingate.pipeline.model.schema import Finding, PipelineReport, StageReport
from traingate.reports.facts import StagePage
from traingate.reports.clip import REPORT_MD_LIMIT, fit

SEVERITY_MARK = {"critical": "🛑", "high": "🔴", "medium": "🟠", "low": "🟡", "info": "ℹ️"}
STATUS_MARK = {"passed": "✅ passed", "blocked": "⛔ blocked", "skipped": "⏭️ skipped", "error": "💥 error"}


# Where `python -m traingate.reports.precompile` leaves the compiled templates, as compileall
# leaves .pyc files: compiling them takes a gate run ~0.2 s, loading them a few milliseconds.
COMPILED_TEMPLATES = Path(__file__).parent / "__pycache__" / "templates"


class CompiledTemplates(FileSystemBytecodeCache):
    """Compiled templates from `folder`. Jinja uses one only while its template's source
    checksum still matches (an edited template is compiled afresh); written only when
    `writable` (by the precompile step), never while a gate runs."""

    def __init__(self, folder: Path, writable: bool = False) -> None:
        super().__init__(str(folder))
        self.folder = folder
        self.writable = writable

    def dump_bytecode(self, bucket: Bucket) -> None:
        if self.writable:
            self.folder.mkdir(parents=True, exist_ok=True)
            super().dump_bytecode(bucket)


class TemplateFiles(BaseLoader):
    """A template named by its absolute path (a stage's own, in its folder), read from disk."""

    def get_source(self, environment: Environment, template: str) -> tuple[str, str, Callable[[], bool]]:
        path = Path(template)
        if not path.is_absolute() or not path.is_file():
            raise TemplateNotFound(template)
        mtime = path.stat().st_mtime
        return path.read_text(encoding="utf-8"), str(path), lambda: path.is_file() and path.stat().st_mtime == mtime

    def list_templates(self) -> list[str]:
        return []  # only by path: `traingate.reports.precompile` finds the stages' own


@lru_cache(maxsize=1)
def _env() -> Environment:
    return template_environment()


def load_templates(pages: Iterable[StagePage] = ()) -> None:
    """Load every report template into this process's environment: the gate's and the pages'
    own. For a process that many gate runs fork from (a gate server), each of which would
    otherwise load the ones it renders."""
    env = _env()
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)
    for page in pages:
        if page.template is not None:
            env.get_template(str(page.template))


def template_environment(loader: BaseLoader | None = None, compiled: CompiledTemplates | None = None) -> Environment:
    """The report templates' environment (the package's templates, their compiled forms)."""
    env = Environment(
        loader=loader or ChoiceLoader([PackageLoader("traingate.reports", "templates"), TemplateFiles()]),
        bytecode_cache=compiled or CompiledTemplates(COMPILED_TEMPLATES),
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters.update(
        location=format_location,
        num=format_number,
        cell=table_cell,
        tojson_pretty=lambda v: json.dumps(v, indent=2, default=str),
        severity_mark=lambda s: SEVERITY_MARK.get(str(getattr(s, "value", s)), ""),
        status_mark=lambda s: STATUS_MARK.get(str(getattr(s, "value", s)), str(s)),
    )
    return env


def format_location(finding_or_loc: Any) -> str:
    loc = getattr(finding_or_loc, "location", finding_or_loc)
    if loc is None:
        return "—"
    text = table_cell(loc.path) + (f":{loc.line}" if loc.line else "")
    return f"`{text}`" + (f" in `{table_cell(loc.function)}`" if loc.function else "")


def format_number(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "—" if value is None else str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value != 0 and (abs(value) >= 1e6 or abs(value) < 10 ** -digits):
            return f"{value:.{digits}g}"
        text = f"{value:,.{digits}f}"
        # digits=0 has no decimal point to trim: "13.89" shows as "14", never unrounded.
        return text.rstrip("0").rstrip(".") if "." in text else text
    return str(value)


# Terminal escape sequences a target's output carries (colours, cursor moves, titles): CSI,
# OSC (ended by BEL or ST), and the two-character escapes.
ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]?")
# Line breaks (\r\n counts once) and every other control character, C0, DEL and C1.
LINE_BREAK = re.compile(r"\r\n|[\n\r\v\f\x1c-\x1e\x85\u2028\u2029]")
CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x1f\x7f-\x9f]")


def one_line(value: Any) -> str:
    """Target text (an exception message, a test name, a path) on one clean line: escape
    sequences and control characters dropped, line breaks and tabs made spaces."""
    text = ANSI_ESCAPE.sub("", str(value))
    text = LINE_BREAK.sub(" ", text).replace("\t", " ")
    return CONTROL.sub("", text)


def table_cell(value: Any, pipes: bool = True) -> str:
    """Target text for a report, as the `cell` filter every template uses: `one_line`, with `|`
    escaped for a table cell; with `pipes` false, for a title, a list item or the terminal."""
    text = one_line(value)
    return text.replace("|", "\\|") if pipes else text


def render_report_md(report: PipelineReport, limit: int = REPORT_MD_LIMIT) -> str:
    """The combined report, short enough for a pull-request comment (evidence cut, never findings)."""
    return fit(_render_report_md, report, limit)


def _render_report_md(report: PipelineReport) -> str:
    return _env().get_template("report.md.j2").render(report=report, findings=report.findings())


def render_stage_md(report: PipelineReport, stage: StageReport, page: StagePage | None = None) -> str:
    """One stage's page: its own template and details model when the gate gives them (`page`)."""
    page = page or StagePage()
    template = _env().get_template(str(page.template) if page.template is not None else "stage.md.j2")
    details = page.details_model.model_validate(stage.details) if page.details_model is not None else stage.details
    return template.render(report=report, stage=stage, details=details, findings=sorted(stage.findings, key=Finding.sort_key))


def render_summary(report: PipelineReport) -> str:
    return _env().get_template("summary.txt.j2").render(report=report, findings=report.findings())
