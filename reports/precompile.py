"""`python -m traingate.reports.precompile`: compile every report template once, into
`reports/__pycache__/templates` (`traingate.reports.render.COMPILED_TEMPLATES`), as compileall does for
modules: the gate's own and each stage's page (`stages/<name>/*.md.j2`, found as files: no
stage is imported). Part of an install from a checkout; a gate run only reads them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from traingate.reports.render import COMPILED_TEMPLATES, CompiledTemplates, template_environment


def stage_templates() -> list[Path]:
    spec = importlib.util.find_spec("traingate.stages")
    folders = spec.submodule_search_locations if spec is not None and spec.submodule_search_locations else []
    return sorted(path.resolve() for folder in folders for path in Path(folder).glob("*/*.md.j2"))


def main() -> None:
    env = template_environment(compiled=CompiledTemplates(COMPILED_TEMPLATES, writable=True))
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)
    for path in stage_templates():
        env.get_template(str(path))


if __name__ == "__main__":
    main()
