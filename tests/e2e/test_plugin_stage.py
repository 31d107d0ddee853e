"""A stage of a team's own, installed from a package outside `stages/` through the
`traingate.stages` entry point (tests/plugin_site: the package and its dist-info), with a
category, rule, configuration section, threshold under the policy, history metric, payload
model, details model and page template of its own, importing only `traingate.stages.api`. The
gate runs it on a target and its finding reaches report.json, report.md, its page, SARIF and
`traingate explain`; the CI policy puts a floor under its threshold and `traingate history`
shows its metric, with nothing of it (nor of the built-in stages) in `pipeline/` or `reports/`."""

from __future__ import annotations

import ast
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import GateRun, run_gate, start_cli
from tests.paths import PLUGIN_SITE, REPO
from traingate.pipeline.model.registry import build_registry, parts
from traingate.pipeline.model.schema import Category



def _with_plugin() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PLUGIN_SITE), env.get("PYTHONPATH", "")) if p)
    return env


def _target(root: Path, section: str) -> Path:
    root.mkdir()
    (root / "helpers.py").write_text("def scale(x):\n    return 2 * x\n")
    (root / "train.py").write_text(textwrap.dedent("""
        import helpers


        def train(steps=2):
            return helpers.scale(steps)
    """))
    (root / "traingate.toml").write_text(textwrap.dedent(f"""
        tests = false

        [entrypoint]
        call = "train:train"

        {section}
    """))
    return root


# The target's licence is 50 bytes and its own policy asks for 10: enough by the target's
# threshold, too short under the CI's floor of 100, which the target cannot lower.
SHORT_LICENCE = "MIT licence of the target under review: 50 bytes.\n"


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    base = tmp_path_factory.mktemp("plugin")
    target = _target(base / "target", '[licence]\nfiles = ["LICENSE", "LICENCE.txt"]\n\n[policy]\nlicence_min_bytes = 10')
    (target / "LICENSE").write_text(SHORT_LICENCE)
    ci_policy = base / "ci-policy.toml"
    ci_policy.write_text("licence_min_bytes = 100\n")
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = _with_plugin()["PYTHONPATH"]
    try:
        return run_gate(target, base / "versions" / "v1", "--stages", "execution,licence", "--format", "md,json,sarif", "--policy", str(ci_policy))
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)


def test_its_finding_reaches_report_json_with_its_details_and_payload(plugin_run: GateRun) -> None:
    [finding] = plugin_run.findings("missing-licence")
    assert finding["stage"] == "licence" and finding["blocking"] and finding["rule"] == "missing-licence"
    stage = plugin_run.stage("licence")
    # Its configuration section was read (two files looked for), and its instrument's payload
    # came back from inside the training run: the target's own module it imported.
    assert stage["details"]["looked_for"] == ["LICENSE", "LICENCE.txt"]
    assert "helpers" in stage["details"]["imported"] and "train" in stage["details"]["imported"]
    assert plugin_run.report["decision"] == "BLOCK"


def test_the_ci_policy_floors_its_threshold(plugin_run: GateRun) -> None:
    assert len(SHORT_LICENCE.encode()) == 50
    [finding] = plugin_run.findings("missing-licence")
    assert finding["evidence"]["data"]["min_bytes"] == 100  # the CI's floor, not the target's 10
    policy = plugin_run.report["policy"]
    assert {"key": "licence_min_bytes", "value": 100, "source": "ci-policy"} in policy["settings"]
    [ignored] = [i for i in policy["ignored"] if i["key"] == "licence_min_bytes"]
    assert ignored["value"] == 10 and "looser than 100" in ignored["reason"]


def test_history_shows_its_metric(plugin_run: GateRun) -> None:
    done = start_cli(["history", str(plugin_run.out.parent)], env=_with_plugin(), timeout=60)
    assert done.returncode == 0, done.stderr
    header, _, row = [line for line in done.stdout.splitlines() if line.startswith("|")][:3]
    columns = [c.strip() for c in header.strip("|").split("|")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    imported = len(plugin_run.stage("licence")["details"]["imported"])
    assert imported >= 2 and cells[columns.index("Modules imported")] == str(imported)


def test_it_imports_nothing_of_traingate_but_the_stage_api() -> None:
    imported = set()
    for path in (PLUGIN_SITE / "licence_stage").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
    assert {m for m in imported if m.split(".")[0] == "traingate"} == {"traingate.stages.api"}


def test_its_page_is_rendered_from_its_own_template(plugin_run: GateRun) -> None:
    page = (plugin_run.out / "licence.md").read_text()
    assert page.startswith("# Licence stage")
    assert "| LICENSE, LICENCE.txt | none |" in page and "- `helpers`" in page
    assert "No licence file" in (plugin_run.out / "report.md").read_text()


def test_sarif_lists_its_rule_and_its_result(plugin_run: GateRun) -> None:
    sarif = json.loads((plugin_run.out / "report.sarif").read_text())
    run = sarif["runs"][0]
    rule_ids = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    assert "missing-licence" in rule_ids
    assert [r["ruleId"] for r in run["results"] if r["ruleId"] == "missing-licence"] == ["missing-licence"]


def test_explain_prints_its_rule() -> None:
    done = start_cli(["explain", "missing-licence"], env=_with_plugin(), timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("missing-licence (licence stage, usually high)")
    listed = start_cli(["explain"], env=_with_plugin(), timeout=60).stdout
    assert any(line.startswith("missing-licence ") for line in listed.splitlines())


def test_its_configuration_section_is_validated_by_its_model(tmp_path: Path) -> None:
    target = _target(tmp_path / "target", "[licence]\nfiles = []")
    done = start_cli(["run", str(target), "--out", str(tmp_path / "out"), "--stages", "licence"], env=_with_plugin(), timeout=120)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    [error] = [f for s in report["stages"] for f in s["findings"] if f["category"] == "config-error"]
    assert "licence.files" in error["title"] + error["problem"] + error["evidence"]["summary"]
    assert done.returncode == 2 and "licence.files" in done.stderr


def test_without_the_package_its_section_is_an_unknown_key(tmp_path: Path) -> None:
    target = _target(tmp_path / "target", "[licence]\nfiles = [\"LICENSE\"]")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = start_cli(["run", str(target), "--out", str(tmp_path / "out"), "--stages", "execution"], env=env, timeout=120)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    [error] = [f for s in report["stages"] for f in s["findings"] if f["category"] == "config-error"]
    assert "traingate.licence: Extra inputs are not permitted" in done.stderr and "licence" in error["title"]
    assert done.returncode == 2


def _stage_knowledge() -> tuple[set[str], set[str], set[str]]:
    """What only the registered stages know: the strings (their names, categories, rule ids,
    threshold keys, section keys, history metric ids), the prefixes of their dotted keys, and
    the Python names of their category objects."""
    strings: set[str] = set()
    prefixes: set[str] = set()
    for name, stage in build_registry().items():
        found = parts(stage)
        strings |= {name, *(c.value for c in found.categories), *(r.id for r in found.rules), *found.extra_sections}
        strings |= set(found.policy_model.model_fields) if found.policy_model else set()
        strings |= {i for metric in found.history_metrics for i in (*metric.ids, metric.total) if i}
        prefixes |= {f"{key}." for key in (name, *found.extra_sections)} | {m.prefix for m in found.history_metrics if m.prefix}
    owned = {c for stage in build_registry().values() for c in parts(stage).categories}
    identifiers = {
        attr for module in list(sys.modules.values()) if module is not None and module.__name__.startswith("traingate.stages.")
        for attr, value in vars(module).items() if isinstance(value, Category) and value in owned
    }
    return strings, prefixes, identifiers


def _docstrings(tree: ast.Module) -> set[int]:
    return {
        id(node.body[0].value) for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)
    }


def test_the_gate_names_no_stage() -> None:
    """`pipeline/` and `reports/` know stages only through the registry: they import no stage's
    module, reference none of the stages' category objects, and hold none of what a stage
    declares (its name, categories, rule ids, threshold and section keys, history metric ids)
    in their code, docstrings aside."""
    strings, prefixes, identifiers = _stage_knowledge()
    assert {"execution", "memory-leak", "amp_speedup_min", "distributed", "amp.speedup"} <= strings and "MEMORY_LEAK" in identifiers
    named = []
    for folder in ("pipeline", "reports"):
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            docstrings = _docstrings(tree)
            where = path.relative_to(REPO)
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module:
                    modules = [node.module]
                elif isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                else:
                    modules = []
                named += [f"{where}:{node.lineno} imports {m}" for m in modules if m.startswith("traingate.stages.") and not m.startswith(("traingate.stages.contract", "traingate.stages.common"))]
                if isinstance(node, ast.Attribute) and node.attr in identifiers or isinstance(node, ast.Name) and node.id in identifiers:
                    named.append(f"{where}:{node.lineno} references {ast.unparse(node)}")
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    if node.value in strings or any(node.value.startswith(p) for p in prefixes):
                        named.append(f"{where}:{node.lineno} holds {node.value!r}")
    assert named == []


def test_a_registered_stage_that_does_not_load_is_an_internal_error_not_a_traceback(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "broken_stage-0.1.dist-info").mkdir(parents=True)
    (site / "broken_stage-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-stage\nVersion: 0.1\n")
    (site / "broken_stage-0.1.dist-info" / "entry_points.txt").write_text("[traingate.stages]\nbroken = no_such_module:Stage\n")
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = start_cli(["run", str(_target(tmp_path / "target", "")), "--out", str(tmp_path / "out")], env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("traingate: internal error: RegistryError: stage 'broken'") and "Traceback" not in done.stderr


def test_a_stage_with_a_misspelt_attribute_fails_at_load_in_one_line(tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "misspelt_stage-0.1.dist-info").mkdir(parents=True)
    (site / "misspelt_stage-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: misspelt-stage\nVersion: 0.1\n")
    (site / "misspelt_stage-0.1.dist-info" / "entry_points.txt").write_text("[traingate.stages]\nmisspelt = misspelt_stage:Stage\n")
    (site / "misspelt_stage.py").write_text(textwrap.dedent("""
        class Stage:
            name = "misspelt"
            order = 60
            detail_model = None  # the interface's name is details_model

            def run(self, ctx):
                raise AssertionError("never run: the stage does not load")
    """))
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = start_cli(["run", str(_target(tmp_path / "target", "")), "--out", str(tmp_path / "out")], env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "stage 'misspelt'" in line and "misspelt_stage:Stage" in line
    assert "unknown attribute 'detail_model'" in line and "did you mean 'details_model'?" in line


def _load_site(tmp_path: Path, body: str) -> str:
    """The one-line error of `traingate explain` with a stage `odd` of `body` installed (exit 3)."""
    site = tmp_path / "site"
    (site / "odd_stage-0.1.dist-info").mkdir(parents=True)
    (site / "odd_stage-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: odd-stage\nVersion: 0.1\n")
    (site / "odd_stage-0.1.dist-info" / "entry_points.txt").write_text("[traingate.stages]\nodd = odd_stage:Odd\n")
    (site / "odd_stage.py").write_text(textwrap.dedent(body))
    done = start_cli(["explain"], env={**os.environ, "PYTHONPATH": str(site)}, timeout=60)
    assert done.returncode == 3, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("traingate: internal error: RegistryError: stage 'odd' (odd_stage:Odd)"), line
    return line


def test_a_stage_that_lists_its_categories_apart_from_its_rules_fails_at_load(tmp_path: Path) -> None:
    line = _load_site(tmp_path, """
        from traingate.stages.api import Category, Stage

        class Odd(Stage):
            name = "odd"
            order = 60
            categories = frozenset({Category("odd-thing")})
    """)
    assert "unknown attribute 'categories'" in line and "those of its `rules`" in line


def test_a_threshold_without_its_direction_fails_at_load(tmp_path: Path) -> None:
    line = _load_site(tmp_path, """
        from pydantic import BaseModel
        from traingate.stages.api import Stage

        class OddPolicy(BaseModel):
            odd_min: float = 1.0

        class Odd(Stage):
            name = "odd"
            order = 60
            policy_model = OddPolicy
    """)
    assert "threshold 'odd_min' without the direction" in line


def test_a_rule_takes_keyword_arguments_only() -> None:
    from traingate.stages.api import Blocks, Rule, Severity

    with pytest.raises(TypeError):
        Rule(Category("odd-thing"), "odd", Severity.LOW, "d", "c", "m", Blocks.NEVER, "i", "f")  # type: ignore[misc]
