"""One finding per cause: a check that finds the same cause at several places (test files the
suite leaves out) reports it once, listing the places in its evidence and as the SARIF result's
locations; and the score of such a pass reads as a pass."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import TARGETS, GateRun
from tests.paths import SCHEMAS
from traingate.pipeline.model.findings import locations_data
from traingate.pipeline.gate.policy import PASS_SCORE_FLOOR
from traingate.pipeline.model.config import TargetConfig
from traingate.pipeline.model.schema import LOCATIONS_KEY, Evidence, EvidenceKind, Finding, Location, Severity, TakenOut, TestRecord
from traingate.stages.base import StageContext
from traingate.stages.execution.accounting_checks import module_skips
from traingate.stages.execution.environment_groups import one_per_need
from traingate.stages.execution.rules import TEST_ENVIRONMENT, TEST_FAILURE, TEST_SELECTION

NARROWED = TARGETS / "exec_narrowed_suite"
LEFT_OUT = [f"tests/test_m{n:02d}.py" for n in range(2, 22)]


@pytest.fixture
def narrowed_gate(shared_gate: Callable[..., tuple[GateRun, float]]) -> GateRun:
    return shared_gate("exec_narrowed_suite", "--stages", "execution", "--format", "json,md,sarif")[0]


@pytest.mark.slow
def test_a_suite_narrowed_to_one_file_of_twenty_one_is_one_finding_naming_the_twenty(narrowed_gate: GateRun) -> None:
    run = narrowed_gate
    assert run.returncode == 0 and run.report["decision"] == "PASS", run.stdout + run.stderr
    [selection] = run.findings("test-selection")
    assert run.findings() == [selection]
    assert selection["severity"] == "low" and not selection["blocking"]
    assert selection["evidence"]["data"]["files"] == LEFT_OUT
    named = selection["problem"].split(" define")[0]
    assert named.split(", ") == LEFT_OUT
    assert selection["title"].startswith("20 test files are not part of the test run")
    assert [place["path"] for place in selection["evidence"]["data"][LOCATIONS_KEY]] == LEFT_OUT
    # One low note: the pass reads as one.
    assert PASS_SCORE_FLOOR <= run.report["score"] == 99


@pytest.mark.slow
def test_the_sarif_result_carries_every_left_out_file(narrowed_gate: GateRun) -> None:
    sarif = json.loads((narrowed_gate.out / "report.sarif").read_text())
    schema = json.loads((SCHEMAS / "sarif-schema-2.1.0.json").read_text())
    jsonschema.Draft4Validator(schema).validate(sarif)
    [result] = sarif["runs"][0]["results"]
    uris = [loc["physicalLocation"]["artifactLocation"]["uri"] for loc in result["locations"]]
    assert [uri.rsplit("/", 2)[-2] + "/" + uri.rsplit("/", 1)[-1] for uri in uris] == LEFT_OUT


def _grouped(location: Location | None, places: list[object]) -> Finding:
    evidence = Evidence(kind=EvidenceKind.OBSERVED, data={LOCATIONS_KEY: places})
    return Finding.create(
        stage="execution", category=TEST_SELECTION, severity=Severity.LOW, title="t", location=location,
        problem="p", impact="i", fix="f", evidence=evidence, block_on=set(),
    )


def test_every_location_lists_the_finding_s_own_first_and_each_place_once() -> None:
    a, b = Location(path="a.py", line=3), Location(path="b.py")
    assert _grouped(a, locations_data([a, b, b])).every_location() == [a, b]
    assert _grouped(None, locations_data([b])).every_location() == [b]
    # A record that is not a place is left out, never an error in a renderer.
    assert _grouped(a, ["b.py", {"line": 2}, *locations_data([b])]).every_location() == [a, b]


def _ctx(root: Path) -> StageContext:
    return StageContext(stage="execution", root=root, config=TargetConfig(), device="cpu", deadline=time.time() + 60, scratch=root / "scratch")


def _module_skipped(module: str, reason: str) -> TestRecord:
    where = Location(path=module, line=3)
    return TestRecord(nodeid=module, outcome="skipped", path=module, taken_out=TakenOut(how="module-skipped", by="pytest.skip()", reason=reason, where=where))


def test_modules_skipped_for_one_reason_are_one_finding(tmp_path: Path) -> None:
    records = [_module_skipped(f"tests/test_{n}.py", "needs transformers") for n in "abc"] + [_module_skipped("tests/test_d.py", "slow")]
    grouped, single = module_skips(_ctx(tmp_path), records)
    assert grouped.title == "3 test modules skipped at collection: needs transformers" and grouped.location is None
    assert grouped.evidence.data["modules"] == ["tests/test_a.py", "tests/test_b.py", "tests/test_c.py"]
    assert [place.path for place in grouped.every_location()] == grouped.evidence.data["modules"]
    assert single.title == "tests/test_d.py skipped at collection: slow" and single.location == Location(path="tests/test_d.py", line=3)


def _needs(ctx: StageContext, nodeid: str, environment: dict[str, str]) -> Finding:
    return ctx.finding(
        category=TEST_ENVIRONMENT, title=f"{nodeid} could not run here", location=Location(path=nodeid.split("::")[0], line=1),
        problem="p", evidence=Evidence(kind=EvidenceKind.OBSERVED, data={"nodeid": nodeid, "environment": environment}),
        severity=Severity.LOW, key=nodeid,
    )


def test_tests_that_need_the_same_package_are_one_finding(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path)
    hub = {"kind": "missing-package", "module": "transformers", "package": "transformers", "detail": "d"}
    network = {"kind": "network", "type": "socket.gaierror", "detail": "d"}
    found = [_needs(ctx, f"tests/test_{n}.py", hub) for n in "abc"] + [_needs(ctx, "tests/test_net.py::test_fetch", network)]
    other = found[0].model_copy(update={"category": TEST_FAILURE})
    kept, merged, net = one_per_need(ctx, [other, *found])
    assert kept is other and net is found[3]
    assert merged.title == "3 tests or test modules could not run here: they need 'transformers'" and not merged.blocking
    assert merged.evidence.data["tests"] == ["tests/test_a.py", "tests/test_b.py", "tests/test_c.py"]
    assert [place.path for place in merged.every_location()] == merged.evidence.data["tests"]
    assert "pytest.importorskip('transformers')" in merged.fix
