"""`python -m traingate.reports.precompile`: compile every report template once, into
`reports/__pycache__/templates` (`traingate.reports.render.COMPILED_TEMPLATES`), as compileall does for
modules. Part of an install from a checkout; a gate run only reads them."""

from __future__ import annotations

from traingate.reports.render import COMPILED_TEMPLATES, CompiledTemplates, template_environment


def main() -> None:
    env = template_environment(compiled=CompiledTemplates(COMPILED_TEMPLATES, writable=True))
    for name in env.list_templates(extensions=["j2"]):
        env.get_template(name)


if __name__ == "__main__":
    main()
