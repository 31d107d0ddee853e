"""A stage of a team's own, installed from a package outside `stages/` through the
`traingate.stages` entry point (tests/plugin_site: the package and its dist-info), with a
category, rule, configuration section, payload model, details model and page template of its
own. The gate runs it on a target and its finding reaches report.json, report.md, its page,
SARIF and `traingate explain`, with nothing of it named in `pipeline/` or `reports/`."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.conftest import GateRun, run_gate, start_cli

PLUGIN_SITE = Path(__file__).parent / "plugin_site"
REPO = Path(__file__).resolve().parents[1]


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


@pytest.fixture(scope="module")
def plugin_run(tmp_path_factory: pytest.TempPathFactory) -> GateRun:
    base = tmp_path_factory.mktemp("plugin")
    target = _target(base / "target", '[licence]\nfiles = ["LICENSE", "LICENCE.txt"]')
    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = _with_plugin()["PYTHONPATH"]
    try:
        return run_gate(target, base / "out", "--stages", "execution,licence", "--format", "md,json,sarif")
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


def test_the_gate_names_no_stage() -> None:
    """`pipeline/` and `reports/` know stages only through the registry."""
    named = []
    for folder in ("pipeline", "reports"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            for stage in ("execution", "performance", "concurrency", "correctness"):
                if f'"{stage}"' in text or f"'{stage}'" in text or f"stages.{stage}" in text:
                    named.append(f"{path.relative_to(REPO)}: {stage}")
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
            categories = frozenset()
            detail_model = None  # the interface's name is details_model

            def run(self, ctx):
                raise AssertionError("never run: the stage does not load")
    """))
    env = {**os.environ, "PYTHONPATH": str(site)}
    done = start_cli(["run", str(_target(tmp_path / "target", "")), "--out", str(tmp_path / "out")], env=env, timeout=120)
    assert done.returncode == 3, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "stage 'misspelt'" in line and "unknown attribute 'detail_model'" in line and "did you mean 'details_model'?" in line
