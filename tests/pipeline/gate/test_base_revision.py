"""`--baseline REVISION` (`pipeline/gate/base_revision.py`): a change judged against its base
commit with nothing but the revision given. Unit: a revision git does not know, and which kept
reports are used. End to end (slow): the base verified from a clean tree of its commit, its
report kept, then read back by the next run; the decision is the two-step run's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TARGETS, cli_env, run_gate
from traingate import __version__
from traingate.pipeline.gate import base_revision
from traingate.pipeline.gate.orchestrator import RunRequest, baseline_unavailable_report

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false", "-c", "init.defaultBranch=main"]
CLEAR = "        optimizer.zero_grad(set_to_none=True)\n"


def _repo(tmp_path: Path) -> tuple[Path, str]:
    """corr_clean committed as the base, then a change that stops clearing the gradients."""
    repo = tmp_path / "repo"
    shutil.copytree(TARGETS / "corr_clean", repo)
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "base"], check=True)
    base = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    train = repo / "train.py"
    assert CLEAR in train.read_text()
    train.write_text(train.read_text().replace(CLEAR, ""))
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qam", "change"], check=True)
    return repo, base


def test_a_value_is_a_report_when_it_names_one_and_a_revision_otherwise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "tests").mkdir()
    (tmp_path / "base.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert base_revision.is_report_path("base.json") and base_revision.is_report_path("missing.json")
    assert base_revision.is_report_path(str(tmp_path / "tests")) and base_revision.is_report_path("./tests")
    assert not base_revision.is_report_path("tests") and not base_revision.is_report_path("origin/main")


def test_a_revision_git_does_not_know_gives_no_baseline_and_says_so(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    found = base_revision.resolve(repo, "origin/main", "T", tmp_path / "store", None, [])
    assert found.report is None and found.commit is None and found.problem is not None and "shallow clone" in found.problem
    assert base_revision.resolve(repo, "--upload-pack=x", "T", tmp_path / "store", None, []).commit is None


def test_a_kept_report_is_used_only_for_its_commit_version_and_policy(tmp_path: Path) -> None:
    commit = "a" * 40
    request = RunRequest(root=tmp_path, task="T", version="v", stages=[], out=tmp_path / "out", device="cpu")
    report = baseline_unavailable_report(request, "main", "a report to keep").model_dump(mode="json")
    report["target"]["commit"] = commit
    folder = tmp_path / "T" / commit
    folder.mkdir(parents=True)
    (folder / "report.json").write_text(json.dumps(report))
    kept = {"commit": commit, "task": "T", "tool_version": __version__, "policy": "none"}
    (folder / base_revision.KEPT).write_text(json.dumps(kept))
    data, why = base_revision._kept(folder, commit, "T", "none")
    assert data is not None and why is None
    # A base that blocks is still the floor, and the note says so.
    assert "the base itself BLOCKs" in base_revision._blocked(data) and base_revision._blocked({**data, "decision": "PASS"}) == ""
    for key, value in (("tool_version", "0.0.1"), ("policy", "f" * 64)):
        (folder / base_revision.KEPT).write_text(json.dumps({**kept, key: value}))
        data, why = base_revision._kept(folder, commit, "T", "none")
        assert data is None and why is not None and key in why
    assert base_revision._kept(tmp_path / "none", commit, "T", "none") == (None, None)


@pytest.mark.slow
def test_the_base_is_verified_from_its_commit_kept_and_read_back(tmp_path: Path) -> None:
    repo, base = _repo(tmp_path)
    store = tmp_path / "store"
    first = run_gate(repo, tmp_path / "out1", "--stages", "correctness", "--baseline", "HEAD~1", "--reports", str(store))
    assert first.returncode == 1 and first.report["decision"] == "BLOCK"
    assert "stale-gradients" in {f["category"] for s in first.report["stages"] for f in s["findings"] if f["blocking"]}
    source = first.report["baseline"]["source"]
    assert (source["revision"], source["commit"], source["how"]) == ("HEAD~1", base, "verified")
    kept = store / "CORR-CLEAN" / base / "report.json"
    assert kept.is_file() and json.loads(kept.read_text())["decision"] == "PASS"
    assert "verified in this run" in (tmp_path / "out1" / "report.md").read_text()
    # The next run reads the kept report; the two-step run (base report given) decides the same.
    second = run_gate(repo, tmp_path / "out2", "--stages", "correctness", "--baseline", base[:10], "--reports", str(store))
    assert second.report["baseline"]["source"]["how"] == "kept" and second.report["decision"] == "BLOCK"
    two_step = run_gate(repo, tmp_path / "out3", "--stages", "correctness", "--baseline", str(kept))
    assert two_step.report["baseline"]["source"] is None
    blocking = [sorted(f["id"] for s in r.report["stages"] for f in s["findings"] if f["blocking"]) for r in (first, second, two_step)]
    assert blocking[0] == blocking[1] == blocking[2]
    # `run --keep` (a push to the default branch): the report kept as its commit's, on a clean checkout only.
    head = first.report["target"]["commit"]
    assert "kept as the baseline report" in base_revision.keep(repo, tmp_path / "out1" / "report.json", tmp_path / "pushed", None)
    assert base_revision._kept(tmp_path / "pushed" / "CORR-CLEAN" / head, head, "CORR-CLEAN", "none")[0] is not None
    (repo / "train.py").write_text("# edited\n")
    assert "uncommitted" in base_revision.keep(repo, tmp_path / "out1" / "report.json", tmp_path / "dirty", None)


@pytest.mark.slow
def test_the_action_on_a_pull_request_judges_the_change_against_its_base(tmp_path: Path) -> None:
    """The action's gate step as a runner runs it on a `pull_request` event, with the example
    workflow's inputs and nothing else: the base comes from the event and is verified first."""
    from tests.reports.test_formats import _action_step

    repo, base = _repo(tmp_path)
    github_output = tmp_path / "github_output"
    env = cli_env({k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")})
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", GITHUB_OUTPUT=str(github_output),
        TARGET=str(repo), STAGES="correctness", DEVICE="cpu", POLICY="", BASELINE="", OUT=str(tmp_path / "out"),
        REPORTS=str(tmp_path / "store"), EVENT="pull_request", BASE_SHA=base, KEEP="false",
    )
    done = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", _action_step("gate")], capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    outputs = dict(line.split("=", 1) for line in github_output.read_text().splitlines())
    assert outputs["decision"] == "BLOCK" and outputs["exit-code"] == "1"
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["baseline"]["source"]["commit"] == base and report["baseline"]["source"]["how"] == "verified"


SETUP_BASE = {
    "pyproject.toml": '[tool.traingate]\ntask = "SETUP-FLOOR"\ntests = false\ntimeout_s = 120\n\n[tool.traingate.entrypoint]\ncall = "model:train"\nsetup = "traingate_setup:tiny"\nkwargs = { steps = 8 }\n',
    "traingate_setup.py": "import model\n\n\ndef tiny():\n    return {\"model\": model.Real()}\n",
    "model.py": (
        "import torch\n\n\nclass Real(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n        self.body = torch.nn.Linear(8, 16)\n"
        "        self.head = torch.nn.Linear(16, 1)\n\n    def forward(self, x):\n        return self.head(torch.tanh(self.body(x)))\n\n\n"
        "def train(model, steps=8):\n    torch.manual_seed(0)\n    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)\n    x, y = torch.randn(64, 8), torch.randn(64, 1)\n"
        "    for step in range(steps):\n        batch = slice(step * 8, step * 8 + 8)\n        loss = torch.nn.functional.mse_loss(model(x[batch]), y[batch])\n"
        "        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()\n    return {\"loss\": float(loss)}\n"
    ),
}


@pytest.mark.slow
def test_a_setup_rewritten_to_build_another_model_is_judged_with_the_baselines(tmp_path: Path) -> None:
    """The change cuts the users' model from its loss and rewrites the setup the configuration
    names to build a clean one: the training is observed again with the baseline's setup."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name, text in SETUP_BASE.items():
        (repo / name).write_text(text)
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "base"], check=True)
    model = repo / "model.py"
    model.write_text(model.read_text().replace("return self.head(torch.tanh(self.body(x)))", "return self.head(torch.tanh(self.body(x)).detach())"))
    (repo / "traingate_setup.py").write_text("import torch\n\n\ndef tiny():\n    return {\"model\": torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))}\n")
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qam", "change"], check=True)
    run = run_gate(repo, tmp_path / "out", "--stages", "correctness", "--baseline", "HEAD~1", "--reports", str(tmp_path / "store"))
    blocking = [f for s in run.report["stages"] for f in s["findings"] if f["blocking"]]
    assert run.report["decision"] == "BLOCK", run.stdout
    [cut] = [f for f in blocking if f["category"] == "unused-parameter"]
    assert "with the baseline's setup module" in cut["title"] and cut["location"]["path"] == "model.py"
    assert "baseline's setup module" in run.stage("correctness")["summary"]


def test_a_target_in_a_folder_of_its_repository_is_verified_from_that_folder_of_the_base(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No gate run: the tree is made, and the base's run is asked of the target's folder (a
    stand-in `traingate` records what it was asked)."""
    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    (repo / "sub" / "a.txt").write_text("base\n")
    subprocess.run([*GIT, "init", "-q", str(repo)], check=True)
    subprocess.run([*GIT, "-C", str(repo), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(repo), "commit", "-qm", "base"], check=True)
    asked: list[list[str]] = []

    def fake_run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        if argv[:3] == [sys.executable, "-m", "traingate"]:
            asked.append(argv)
            assert (Path(argv[4]) / "a.txt").read_text() == "base\n"
            return subprocess.CompletedProcess(argv, 2, "", "no report")
        return real_run(argv, **kwargs)  # type: ignore[arg-type]

    real_run = subprocess.run
    monkeypatch.setattr(subprocess, "run", fake_run)
    found = base_revision.resolve(repo / "sub", "HEAD", "T", tmp_path / "store", None, [])
    monkeypatch.undo()
    assert asked and Path(asked[0][4]).name == "sub" and found.problem is not None and "wrote no report" in found.problem


def test_where_reports_are_kept_is_the_command_lines_then_the_ci_policys_never_the_targets(tmp_path: Path) -> None:
    import argparse

    from traingate.pipeline.gate.cli import RunInputs, reports_folder
    from traingate.pipeline.gate.policy_source import CiPolicy, resolve_policy
    from traingate.pipeline.model.config import PolicyConfig, TargetConfig

    ci = CiPolicy(path="ci.toml", policy=PolicyConfig.model_validate({"reports": str(tmp_path / "ci-kept")}))
    effective, provenance = resolve_policy(PolicyConfig.model_validate({"reports": str(tmp_path / "mine")}), "pyproject.toml", ci)
    assert effective.reports == str(tmp_path / "ci-kept") and any(i.key == "reports" for i in provenance.ignored)
    mine_only, _ = resolve_policy(PolicyConfig.model_validate({"reports": str(tmp_path / "mine")}), "pyproject.toml", None)
    assert mine_only.reports is None  # the target's own is never taken

    def inputs(policy: PolicyConfig) -> RunInputs:
        return RunInputs(tmp_path, [], "cpu", None, TargetConfig(policy=policy), None, None, "T", "v", tmp_path / "out", [])

    assert reports_folder(argparse.Namespace(reports=None), inputs(effective)) == (tmp_path / "ci-kept").resolve()
    assert reports_folder(argparse.Namespace(reports=tmp_path / "cli"), inputs(effective)) == (tmp_path / "cli").resolve()
    assert reports_folder(argparse.Namespace(reports=None), inputs(PolicyConfig())) == base_revision.DEFAULT_REPORTS.resolve()
