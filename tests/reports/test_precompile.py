"""Compiled report templates are read, never written, by a gate run, and never used stale."""

from __future__ import annotations

from pathlib import Path

import pytest
from jinja2 import FileSystemLoader

from traingate.reports import precompile
from traingate.reports.render import CompiledTemplates, template_environment


def _never_compile(*args: object, **kwargs: object) -> None:
    raise AssertionError("compiled a template that had a compiled form")


def test_a_compiled_template_is_loaded_and_an_edited_one_compiled_afresh(tmp_path: Path) -> None:
    folder, compiled = tmp_path / "templates", tmp_path / "compiled"
    folder.mkdir()
    (folder / "t.md.j2").write_text("one {{ x }}\n")
    writer = template_environment(FileSystemLoader(folder), CompiledTemplates(compiled, writable=True))
    assert writer.get_template("t.md.j2").render(x=1) == "one 1\n"
    [cache] = compiled.iterdir()
    written = cache.read_bytes()

    reader = template_environment(FileSystemLoader(folder), CompiledTemplates(compiled))
    reader.compile = _never_compile  # type: ignore[method-assign]
    assert reader.get_template("t.md.j2").render(x=2) == "one 2\n"

    # The source changed: its checksum no longer matches the compiled form, which is left as it was.
    (folder / "t.md.j2").write_text("two {{ x }}\n")
    fresh = template_environment(FileSystemLoader(folder), CompiledTemplates(compiled))
    assert fresh.get_template("t.md.j2").render(x=3) == "two 3\n"
    assert cache.read_bytes() == written and len(list(compiled.iterdir())) == 1


def test_the_precompile_step_compiles_every_report_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precompile, "COMPILED_TEMPLATES", tmp_path)
    precompile.main()
    templates = [*template_environment().list_templates(extensions=["j2"]), *map(str, precompile.stage_templates())]
    assert len(precompile.stage_templates()) == 4  # one page for each built-in stage
    assert len(list(tmp_path.iterdir())) == len(templates) >= 6
    reader = template_environment(compiled=CompiledTemplates(tmp_path))
    reader.compile = _never_compile  # type: ignore[method-assign]
    for name in templates:
        reader.get_template(name)
