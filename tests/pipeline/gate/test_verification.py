"""The configuration comparison and the baseline's settings read from git, without a gate run:
each key that narrows what is verified, each that only widens it, and variants of the routes
(a budget cut, a check turned off, a selecting option, a keyword removed) the end-to-end routes
do not take (tests/e2e/test_verification_floor.py)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TARGETS
from tests.report_builders import report, stage
from traingate.pipeline.gate.baseline_config import BaselineSettings, NotCompared, read_baseline_settings
from traingate.pipeline.gate.config_diff import NARROWS, NEUTRAL, WIDENS, baseline_entrypoint_gone, differences
from traingate.pipeline.gate.config_file import load_config
from traingate.pipeline.gate.policy_source import CiPolicy, resolve_policy
from traingate.pipeline.gate.verification import added_waivers, review
from traingate.pipeline.model.config import EntrypointConfig, PolicyConfig, TargetConfig

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
BASE: dict[str, Any] = {"tests": ["tests"], "timeout_s": 90, "entrypoint": {"call": "trainer:fit", "kwargs": {"steps": 6}}}


def _config(**changes: Any) -> TargetConfig:
    data = {**BASE, **changes}
    return TargetConfig.model_validate({k: v for k, v in data.items() if v is not None})


def _effects(current: TargetConfig, base: TargetConfig | None = None, *, files: tuple[str | None, str | None] = ("pyproject.toml", "pyproject.toml")) -> dict[str, str]:
    return {d.key: d.effect for d in differences(base or _config(), files[0], current, files[1], pinned_suite=False)}


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"tests": False}, {"tests": NARROWS}),
        ({"tests": ["tests/test_trainer.py"]}, {"tests": NARROWS}),
        ({"tests": ["tests", "-k", "not slow"]}, {"tests": NARROWS}),
        ({"tests": ["tests", "--deselect", "tests/test_trainer.py::test_mean_error_of_the_fit"]}, {"tests": NARROWS}),
        ({"tests": ["tests", "tests_more"]}, {"tests": WIDENS}),
        ({"timeout_s": 30}, {"timeout_s": NARROWS}),
        ({"timeout_s": 300}, {"timeout_s": WIDENS}),
        ({"entrypoint": {"call": "trainer:other"}}, {"entrypoint.call": NARROWS, "entrypoint.kwargs.steps": NARROWS}),
        ({"entrypoint": {"call": "trainer:fit", "kwargs": {"steps": 2}}}, {"entrypoint.kwargs.steps": NARROWS}),
        ({"entrypoint": {"call": "trainer:fit", "kwargs": {}}}, {"entrypoint.kwargs.steps": NARROWS}),
        ({"entrypoint": {"call": "trainer:fit", "kwargs": {"steps": 6}, "seed": 3}}, {"entrypoint.seed": NARROWS}),
        ({"entrypoint": {"call": "trainer:fit", "kwargs": {"steps": 6}, "setup": "prep:tiny"}}, {"entrypoint.setup": NARROWS}),
        ({"entrypoint": {"call": "trainer:fit", "kwargs": {"steps": 6}, "amp_flag": "use_amp"}}, {"entrypoint.amp_flag": WIDENS}),
        ({"entrypoint": {"script": "train.py", "args": ["--fast"]}}, {"entrypoint.call": NARROWS, "entrypoint.script": NARROWS, "entrypoint.args": NARROWS, "entrypoint.kwargs.steps": NARROWS}),
        ({"entrypoint": None}, {"entrypoint": NARROWS}),
        ({"distributed": {"nproc": 2, "timeout_s": 60}}, {"distributed": WIDENS}),
        ({"correctness": {"overfit_steps": 40}}, {"correctness.overfit_steps": WIDENS}),
        ({"concurrency": {"determinism_runs": 3}}, {"concurrency.determinism_runs": WIDENS}),
        ({"concurrency": {"dataloader_start_methods": ["fork"]}}, {"concurrency.dataloader_start_methods": NARROWS}),
        ({"performance": {"min_steps": 2}}, {"performance.min_steps": NARROWS}),
        ({}, {}),
    ],
)
def test_each_key_is_compared_with_its_direction(changes: dict[str, Any], expected: dict[str, str]) -> None:
    assert _effects(_config(**changes)) == expected


def test_a_check_the_baseline_had_turned_off_narrows() -> None:
    base = _config(correctness={"overfit_steps": 40}, distributed={"nproc": 2, "timeout_s": 60})
    assert _effects(_config(), base) == {"correctness.overfit_steps": NARROWS, "distributed": NARROWS}


def test_a_new_configuration_file_is_listed_and_its_values_compared() -> None:
    effects = _effects(_config(tests=False), files=("pyproject.toml", "traingate.toml"))
    assert effects == {"(file)": NEUTRAL, "tests": NARROWS}


def test_a_suite_the_ci_pins_is_not_compared() -> None:
    assert differences(_config(), "pyproject.toml", _config(tests=["other"]), "pyproject.toml", pinned_suite=True) == []


def _entry(**fields: Any) -> EntrypointConfig:
    return EntrypointConfig.model_validate({"call": "trainer:fit", **fields})


def test_the_baseline_entrypoint_is_gone_only_when_the_files_say_so() -> None:
    root = TARGETS / "verify_base"
    assert baseline_entrypoint_gone(root, _entry(kwargs={"steps": 6})) is None
    assert "defines no 'train'" in (baseline_entrypoint_gone(root, _entry(call="trainer:train")) or "")
    assert "takes no keyword epochs" in (baseline_entrypoint_gone(root, _entry(kwargs={"epochs": 2})) or "")
    assert "cannot import 'gone'" in (baseline_entrypoint_gone(root, _entry(call="gone:fit")) or "")
    assert baseline_entrypoint_gone(root, EntrypointConfig(script="missing.py")) == "its script missing.py is gone"


def test_only_the_ci_may_accept_configuration_changes_or_new_waivers() -> None:
    target = PolicyConfig(allow_config_changes=True, allow_new_waivers=True)
    effective, provenance = resolve_policy(target, "pyproject.toml", None)
    assert not effective.allow_config_changes and not effective.allow_new_waivers
    assert {i.key for i in provenance.ignored} == {"allow_config_changes", "allow_new_waivers"}
    ci = CiPolicy(path="ci.toml", policy=PolicyConfig.model_validate({"allow_config_changes": True, "allow_new_waivers": True}))
    effective, provenance = resolve_policy(PolicyConfig(), "pyproject.toml", ci)
    assert effective.allow_config_changes and effective.allow_new_waivers


def _git(root: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=root, check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """verify_base in a sub-folder of a repository, with an inline waiver, committed."""
    root = tmp_path / "repo"
    target = root / "project"
    shutil.copytree(TARGETS / "verify_base", target)
    text = (target / "trainer.py").read_text()
    (target / "trainer.py").write_text(text.replace("        raise RuntimeError(", "        raise RuntimeError(  # traingate: ignore[entrypoint-crash] known\n            ", 1))
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "base")
    return target


def test_the_baseline_settings_are_read_from_git_at_the_commit(repo: Path) -> None:
    commit = _git(repo, "rev-parse", "HEAD")
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text().replace('tests = ["tests"]', "tests = false"))
    settings = read_baseline_settings(repo, commit)
    assert isinstance(settings, BaselineSettings)
    assert settings.file == "pyproject.toml" and settings.config.tests == ["tests"]  # the commit's, not the working tree's
    [(path, categories, _)] = list(settings.inline)
    assert path == "trainer.py" and categories == ("entrypoint-crash",)


@pytest.mark.parametrize("commit", [None, "--output=/tmp/x", "HEAD", "0" * 40])
def test_a_commit_that_is_not_an_id_in_this_clone_is_not_compared(repo: Path, commit: str | None) -> None:
    settings = read_baseline_settings(repo, commit)
    assert isinstance(settings, NotCompared)


def test_a_waiver_that_moved_with_its_line_is_the_baselines_and_a_new_one_is_not(repo: Path) -> None:
    commit = _git(repo, "rev-parse", "HEAD")
    trainer = repo / "trainer.py"
    # Lines above it added: the baseline's waiver moved down; a new one on another line.
    text = '"""Moved."""\n\n' + trainer.read_text()
    text = text.replace("    return losses\n", "    return losses  # traingate: ignore[host-sync] new\n", 1)
    trainer.write_text(text)
    (repo / "pyproject.toml").write_text((repo / "pyproject.toml").read_text() + '\n[[tool.traingate.waive]]\ncategory = "test-failure"\npath = "tests/x.py"\nreason = "new"\n')
    config, _ = load_config(repo)
    result = review(repo, report([stage("execution")], commit=commit), config)
    added = added_waivers(repo, result, config)
    assert added is not None and added.config == frozenset({1})
    new_line = next(i for i, line in enumerate(text.splitlines(), start=1) if "ignore[host-sync]" in line)
    assert added.inline == frozenset({("trainer.py", new_line)})


def test_split_runs_merge_with_their_configuration_findings_once() -> None:
    from traingate.pipeline.gate.merge import merge_reports
    from traingate.pipeline.model.findings import finding
    from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Location, Severity

    narrowed = finding(
        stage="configuration", category=Category.VERIFICATION_NARROWED, title="`tests` narrowed", location=Location(path="pyproject.toml"),
        problem="p", evidence=Evidence(kind=EvidenceKind.OBSERVED), block_on={Severity.CRITICAL, Severity.HIGH}, key="tests",
    )
    parts = [(f"part{i}", report([stage("configuration", [narrowed]), stage(name)])) for i, name in enumerate(("execution", "performance"))]
    merged = merge_reports(parts, ["execution", "performance"], ["execution", "performance", "concurrency", "correctness"])
    assert [s.name for s in merged.stages] == ["configuration", "execution", "performance"]
    assert [f.id for f in merged.stages[0].findings] == [narrowed.id] and merged.decision.value == "BLOCK"


def test_the_reports_open_with_what_the_change_changed_in_how_it_is_verified() -> None:
    from tests.markdown_tables import table_problems
    from traingate.pipeline.model.schema import ConfigChange, VerificationReview, WaiverEntry
    from traingate.reports import render_summary
    from traingate.reports.facts import RunFacts
    from traingate.reports.render import render_report_md
    from traingate.reports.step_summary import render_step_summary

    waiver = WaiverEntry(origin="trainer.py:21", source="inline", categories=["entrypoint-crash"], path="trainer.py", line=21, reason="tuning | in progress", status="needs-approval", note="added by this change", added=True)
    review_ = VerificationReview(
        compared=True, baseline_commit="a" * 40, baseline_file="pyproject.toml", current_file="pyproject.toml",
        changes=[ConfigChange(key="tests", baseline=["tests"], current=False, effect="narrows", action="blocks")], new_waivers=[waiver],
    )
    shown = report([stage("execution")]).model_copy(update={"verification": review_})
    md = render_report_md(shown)
    assert md.index("## What this change changed in how it is verified") < md.index("## Stages")
    assert '| `tests` | `["tests"]` | `false` | narrows | blocks |' in md and "trainer.py:21" in md
    assert not table_problems(md)
    step = render_step_summary(shown, RunFacts())
    assert step.index("What this change changed in how it is verified") < step.index("| Stage |")
    terminal = render_summary(shown)
    assert terminal.index("tests: [\"tests\"] -> false (narrows; blocks)") < terminal.index("execution")
    unchanged = report([stage("execution")]).model_copy(update={"verification": VerificationReview(compared=False, note="No --baseline: not compared.")})
    assert "What this change changed" not in render_report_md(unchanged) and "No --baseline: not compared." in render_report_md(unchanged)


@pytest.mark.parametrize("category", ["ineffective-step", "training-regression"])
def test_an_inline_waiver_the_change_added_leaves_its_finding_blocking(category: str) -> None:
    from datetime import date

    from traingate.pipeline.gate.waivers import AddedWaivers, Adjudicator, InlineWaiver
    from traingate.pipeline.model.findings import finding
    from traingate.pipeline.model.schema import Category, Evidence, EvidenceKind, Location, Severity

    config = TargetConfig()
    config._inline_waivers = [InlineWaiver(path="train.py", line=12, categories=(Category(category),), reason="known")]
    found = finding(
        stage="correctness", category=Category(category), title="t", location=Location(path="train.py", line=12), problem="p",
        evidence=Evidence(kind=EvidenceKind.MEASURED), block_on={Severity.CRITICAL, Severity.HIGH}, key="k",
    )
    assert found.blocking
    for added, approved, blocks, status in ((None, False, False, "applied"), (AddedWaivers(inline=frozenset({("train.py", 12)})), False, True, "needs-approval"),
                                            (AddedWaivers(inline=frozenset({("train.py", 12)})), True, False, "applied"), (AddedWaivers(), False, False, "applied")):
        policy = config.policy.model_copy(update={"allow_new_waivers": approved})
        judge = Adjudicator(config.model_copy(update={"policy": policy}), None, date(2026, 11, 27), added)
        [judged] = judge.apply([found])
        [entry] = judge.summary().waivers
        assert (judged.blocking, entry.status) == (blocks, status)
        assert entry.added == (None if added is None else bool(added.inline))
