"""Every module of the gate and the stages is in an import contract: a new module is covered by the folder it is put in.

The contracts in pyproject.toml are written over packages and wildcards; these tests read them
the way import-linter does (a module expression with `*` for one name and `**` for one or more;
a package stands for its descendants) and fail when a module under pipeline/, stages/ or reports/
would be checked by no contract, or a stage package is missing from the independence contract.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parent.parent
FOLDERS = ("pipeline", "stages", "reports")
# The packages beside the stages (the agent's, and those every stage shares): not stages themselves.
SHARED_STAGE_PACKAGES = {"agent", "common", "contract", "harness"}


def contracts() -> list[dict]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def imports_anything(path: Path) -> bool:
    return any(isinstance(node, (ast.Import, ast.ImportFrom)) for node in ast.walk(ast.parse(path.read_text())))


def modules_on_disk() -> set[str]:
    """Dotted names of the modules and packages under the three folders that import anything, as installed under `traingate`."""
    names: set[str] = set()
    for folder in FOLDERS:
        for path in (REPO / folder).rglob("*.py"):
            if not imports_anything(path):
                continue  # nothing for a contract to check (the folders' bare `__init__.py`)
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.add(".".join(("traingate", *parts)))
    return names


def expression_pattern(expression: str) -> re.Pattern[str]:
    """import-linter's module expression: `*` one name, `**` one or more names."""
    parts = [r"[^.]+(?:\.[^.]+)*" if part == "**" else r"[^.]+" if part == "*" else re.escape(part) for part in expression.split(".")]
    return re.compile(r"\.".join(parts))


def covers(expression: str, module: str) -> bool:
    """Whether `module` is a module that `expression` names, or a descendant of one (contracts treat modules as packages)."""
    pattern = expression_pattern(expression)
    parts = module.split(".")
    return any(pattern.fullmatch(".".join(parts[:end])) for end in range(1, len(parts) + 1))


def checked_expressions(contract: dict) -> list[str]:
    """The modules whose imports a contract checks."""
    if contract["type"] == "forbidden":
        return list(contract["source_modules"])
    if contract["type"] == "independence":
        return list(contract["modules"])
    if contract["type"] == "layers":
        return [module for layer in contract["layers"] for module in re.split(r"[|:]", layer)]
    raise AssertionError(f"contract type {contract['type']!r} is not read by this test")


def uncovered(modules: set[str], contract_list: list[dict]) -> list[str]:
    expressions = [expression.strip() for contract in contract_list for expression in checked_expressions(contract)]
    return sorted(module for module in modules if not any(covers(expression, module) for expression in expressions))


def stage_packages() -> set[str]:
    return {
        f"traingate.stages.{path.parent.name}"
        for path in (REPO / "stages").glob("*/__init__.py")
        if path.parent.name not in SHARED_STAGE_PACKAGES
    }


def test_every_module_is_in_a_contract() -> None:
    modules = modules_on_disk()
    assert len(modules) > 100  # the folders were found
    assert uncovered(modules, contracts()) == []


def test_every_stage_module_is_checked_as_the_child_or_the_parent_side() -> None:
    """A stage module is checked for the side it runs on, whichever stage folder it is put in."""
    by_name = {contract["name"]: contract for contract in contracts()}
    child = by_name["The child side (harness, probes) does not import the gate or the parent side"]
    parent = by_name["The parent side (agent, stage classes, analyses) does not import the child side"]
    stage_modules = {module for module in modules_on_disk() if module.startswith("traingate.stages.")}
    assert uncovered(stage_modules, [child, parent]) == []
    # The modules the hand-written lists had left out are among those checked.
    for module in ("traingate.stages.correctness.divergence", "traingate.stages.execution.accounting_checks", "traingate.stages.agent.session"):
        assert module in stage_modules and uncovered({module}, [parent]) == []


def test_every_stage_package_is_independent_of_the_others() -> None:
    (independence,) = [contract for contract in contracts() if contract["type"] == "independence"]
    assert stage_packages() == set(independence["modules"])
    assert len(stage_packages()) >= 4


def test_a_module_outside_every_contract_is_reported() -> None:
    """The check itself: a module no expression reaches is listed, wildcards reach only their depth."""
    contract_list = [{"type": "forbidden", "source_modules": ["traingate.pipeline", "traingate.stages.*.probe"]}]
    modules = {"traingate.pipeline.gate.cli", "traingate.stages.correctness.probe.steps", "traingate.stages.correctness.stale", "traingate.reports.render"}
    assert uncovered(modules, contract_list) == ["traingate.reports.render", "traingate.stages.correctness.stale"]
    assert covers("traingate.**", "traingate.pipeline.model.text")
    assert not covers("traingate.stages.*.probe", "traingate.stages.probe")
