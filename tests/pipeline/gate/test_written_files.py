"""Training that writes result files over tracked files is not tampering; changing what the gate
runs or reads still is."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, run_gate
from traingate.pipeline.model.config import EntrypointConfig, TargetConfig
from traingate.pipeline.gate.once_per_run import OncePerRun
from traingate.pipeline.model.schema import Category, Severity
from traingate.pipeline.gate.snapshot import Changes, modification_finding
from traingate.pipeline.gate.written_files import RESULT_FILES_RULE, GateInputs, ResultWrites, is_gate_input, named_paths
from traingate.stages.common.reads import FilesRead

STAGES = ("execution", "performance", "concurrency", "correctness")
# A pip-freeze dump named like an input is still a result: no run reads it.
RESULTS = ["environment/requirements.txt", "repro/metrics.txt", "repro/snapshot.json", "repro/summary.md", "results/metrics.json"]


@pytest.mark.parametrize(
    "rel",
    [
        "train.py", "pkg/model.pyi", "conftest.py", "sitecustomize.pth", "ext/_ops.cpython-311-x86_64-linux-gnu.so",
        "pyproject.toml", "traingate.toml", "pytest.ini", "setup.cfg", "tox.ini", "sub/pyproject.toml",
        # What the gate reads for an `environment` finding: what the target declares.
        "requirements.txt", "requirements-dev.txt", "requirements/base.txt",
    ],
)
def test_code_and_the_configuration_the_gate_and_pytest_parse_are_inputs_by_name(rel: str) -> None:
    assert is_gate_input(rel)


@pytest.mark.parametrize(
    "rel",
    [
        "repro/snapshot.json", "REPRODUCIBILITY.md", "results/metrics.txt", "runs/loss.csv", "latest.txt",
        # Names that look like inputs are results unless a run reads them: decided by observation.
        "environment/requirements.txt", "requirements/nested/pins.txt", "config.yaml", "configs/train.yaml", "hparams.yml", "model.cfg",
    ],
)
def test_files_no_run_read_are_results_whatever_their_name(rel: str) -> None:
    assert not is_gate_input(rel)


def test_a_file_a_run_read_is_an_input_whatever_its_name() -> None:
    read = FilesRead(paths=["configs/train.json", "data/labels.csv"])
    inputs = GateInputs.of(TargetConfig(tests=["tests"]), read)
    assert inputs("configs/train.json") and inputs("data/labels.csv")
    assert not inputs("results/metrics.json") and not inputs("environment/requirements.txt")
    assert inputs("tests/data/golden.txt")  # under a path `tests` names
    assert inputs.read_by_the_run(["results/metrics.json", "configs/train.json"]) == ["configs/train.json"]


@pytest.mark.parametrize(
    ("read", "why"),
    [
        (None, "handed back no record"),
        (FilesRead(paths=["a.json"], complete=False, why_incomplete="1 of the stage's 2 run(s) handed back no record of what they read"), "1 of the stage's 2"),
    ],
)
def test_without_a_complete_record_of_the_reads_every_rewritten_file_is_an_input(read: FilesRead | None, why: str) -> None:
    inputs = GateInputs.of(TargetConfig(), read)
    assert inputs("results/metrics.json") and inputs("environment/requirements.txt")
    assert inputs.unknown_reads is not None and why in inputs.unknown_reads
    finding = modification_finding("execution", Changes(modified=["results/metrics.json"]), [], inputs.unknown_reads)
    assert finding.blocking and why in finding.problem


def test_a_file_handed_to_the_entrypoint_is_an_input() -> None:
    config = TargetConfig(entrypoint=EntrypointConfig(call="train:train", kwargs={"config": "./configs/tiny.json", "steps": 3}))
    named = named_paths(config)
    assert is_gate_input("configs/tiny.json", named) and not is_gate_input("configs/other.json", named)
    assert is_gate_input("data/train.csv", named_paths(TargetConfig(tests=["tests", "data"])))


def test_changes_split_into_inputs_and_results() -> None:
    changes = Changes(modified=["train.py", "repro/snapshot.json"], deleted=["tests/test_a.py", "old.md"])
    inputs, results = changes.partition(GateInputs.of(TargetConfig(tests=["tests"]), FilesRead(paths=[])))
    assert inputs == Changes(modified=["train.py"], deleted=["tests/test_a.py"])
    assert results == Changes(modified=["repro/snapshot.json"], deleted=["old.md"])


def test_result_writes_are_one_low_finding_per_run_and_never_block() -> None:
    writes = ResultWrites()
    first = writes.finding("execution", ["repro/snapshot.json", "repro/summary.md"], [])
    assert first is not None and first.rule == RESULT_FILES_RULE and first.category is Category.TARGET_MODIFIED
    assert first.severity is Severity.LOW and not first.blocking
    assert first.title.startswith("Training writes into tracked files: repro/snapshot.json")
    assert writes.finding("performance", ["repro/summary.md", "repro/snapshot.json"], []) is None
    # A later stage that writes one more file reports that file alone.
    later = writes.finding("correctness", ["repro/summary.md", "repro/extra.txt"], [])
    assert later is not None and later.evidence.data == {"modified": ["repro/extra.txt"], "deleted": []}


def test_environment_findings_of_the_same_modules_are_kept_once() -> None:
    from traingate.pipeline.model.findings import finding
    from traingate.pipeline.model.schema import Evidence, EvidenceKind

    from traingate.pipeline.model.schema import TrainingStopped

    def env(stage: str, missing: list[str], key: str = ""):  # type: ignore[no-untyped-def]
        # The modules are read from the stage's typed note, not from the evidence it shows.
        evidence = Evidence(kind=EvidenceKind.OBSERVED, data={"missing": ["not", "read"]})
        found = finding(stage=stage, category=Category.ENVIRONMENT, title="t", location=None, problem="p", evidence=evidence, block_on=set(), key=key)
        return found, TrainingStopped(finding=found.id, reason="environment", missing=missing)

    once = OncePerRun()
    (a, note_a), (b, note_b) = env("execution", ["a", "b"]), env("execution", ["a", "b"], key="again")
    assert len(once.first_seen([a, b], [note_a, note_b])) == 1
    c, note_c = env("performance", ["b"])
    assert once.first_seen([c], [note_c]) == []
    d, note_d = env("correctness", ["b", "c"])
    assert len(once.first_seen([d], [note_d])) == 1


def _digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def result_files_gate(tmp_path_factory: pytest.TempPathFactory) -> tuple[GateRun, bool]:
    target = TARGETS / "result_files"
    before = _digest(target)
    run = run_gate(target, tmp_path_factory.mktemp("result_files") / "out")
    return run, _digest(target) == before


@pytest.mark.slow
def test_training_that_writes_tracked_result_files_passes(result_files_gate: tuple[GateRun, bool]) -> None:
    run, unchanged = result_files_gate
    assert run.returncode == 0 and run.report["decision"] == "PASS", run.stdout + run.stderr
    assert [s["name"] for s in run.report["stages"]] == list(STAGES)
    assert unchanged, "the user's tree was modified"


@pytest.mark.slow
def test_the_result_files_are_one_low_finding_for_the_whole_run(result_files_gate: tuple[GateRun, bool]) -> None:
    run, _ = result_files_gate
    modified = run.findings("target-modified")
    [written] = modified
    assert written["rule"] == RESULT_FILES_RULE and written["severity"] == "low" and not written["blocking"]
    assert written["stage"] == "execution"  # the first stage that ran the training
    assert sorted(written["evidence"]["data"]["modified"]) == RESULTS
    assert written["title"].startswith("Training writes into tracked files: ")


@pytest.fixture(scope="module")
def config_edit_gate(tmp_path_factory: pytest.TempPathFactory) -> tuple[GateRun, bool]:
    target = TARGETS / "config_edit"
    before = _digest(target)
    run = run_gate(target, tmp_path_factory.mktemp("config_edit") / "out", "--stages", "execution")
    return run, _digest(target) == before


@pytest.mark.slow
def test_a_config_the_training_reads_and_rewrites_blocks(config_edit_gate: tuple[GateRun, bool]) -> None:
    run, unchanged = config_edit_gate
    assert run.returncode == 1 and run.report["decision"] == "BLOCK", run.stdout + run.stderr
    assert unchanged, "the user's tree was modified"
    # config.yaml is no input by its name: it blocks because the runs were seen to read it.
    assert not is_gate_input("config.yaml")
    [modified] = run.findings("target-modified")
    assert modified["rule"] == "target-modified" and modified["blocking"] and modified["severity"] == "critical"
    assert modified["evidence"]["data"] == {"modified": ["config.yaml"], "deleted": []}
    assert "opened config.yaml for reading" in modified["problem"]
