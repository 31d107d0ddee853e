"""The concurrency stage end to end: one gate run per fixture target, every assertion on it.

Each fixture target is run once for the session (`shared_gate`), with `--stages concurrency`,
or with `--stages concurrency,correctness` where tests/stages/correctness/test_correctness.py reads the same
target (one run for both); expected lines come from `# marker:` comments in the fixture
sources, never from hard-coded numbers.
The decision and each finding's category, severity and line are rows of
tests/e2e/test_fixture_targets.py, which reads the same run; the evidence is checked here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.conftest import TARGETS, GateRun, line_of

pytestmark = pytest.mark.slow

Shared = Callable[..., tuple[GateRun, float]]
CONCURRENCY = ("--stages", "concurrency")


def marker_line(case: str, marker: str, file: str = "train.py") -> int:
    return line_of(TARGETS / case / file, f"# marker: {marker}")


def located(finding: dict[str, Any]) -> tuple[str, int]:
    return finding["location"]["path"], finding["location"]["line"]


def assert_observed_blocking(finding: dict[str, Any], severity: str = "high") -> None:
    assert finding["severity"] == severity
    assert finding["blocking"] is True
    assert finding["evidence"]["kind"] in ("observed", "measured")


def test_clip_before_unscale_is_reported_at_the_clip_call(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_clip", *CONCURRENCY)
    stage = run.stage("concurrency")
    assert stage["status"] == "blocked"
    [finding] = run.findings()
    assert_observed_blocking(finding)
    data = finding["evidence"]["data"]
    assert data["rule"] == "clip-before-unscale" and data["iterations"] == 4 and data["scaler_enabled"] is True
    sequence = data["observed_sequence"]
    clip = next(i for i, s in enumerate(sequence) if "clip_grad_norm_" in s)
    unscale = next(i for i, s in enumerate(sequence) if "unscale_" in s)
    assert clip < unscale
    assert stage["details"]["checks"]["determinism"]["verdict"].startswith("identical")
    assert "One observed iteration" in (run.out / "concurrency.md").read_text()


def test_scaler_bypass_missing_update_and_double_unscale_one_finding_each(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_scaler_misuse", *CONCURRENCY)
    findings = run.findings("gradscaler-protocol")
    by_rule = {f["evidence"]["data"]["rule"]: f for f in findings}
    assert set(by_rule) == {"step-bypasses-scaler", "missing-update", "unscale-twice"}  # one per rule and site
    for rule, marker in (("step-bypasses-scaler", "step-bypasses-scaler"), ("missing-update", "missing-update"), ("unscale-twice", "unscale-twice")):
        finding = by_rule[rule]
        assert located(finding) == ("train.py", marker_line("conc_scaler_misuse", marker)), rule
        assert_observed_blocking(finding)
        assert finding["evidence"]["data"]["scaler_enabled"] is False  # disabled off CUDA, still wrong
        assert "disabled" in finding["problem"]
    assert by_rule["missing-update"]["evidence"]["data"]["iterations"] == 3


def test_entropy_seeded_generator_diverges_with_the_same_hash_seed(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_unseeded", *CONCURRENCY)
    assert run.returncode == 1
    [finding] = run.findings("nondeterminism")
    assert located(finding) == ("train.py", marker_line("conc_unseeded", "entropy-seed"))
    assert_observed_blocking(finding)
    data = finding["evidence"]["data"]
    assert data["kind"] == "unseeded-random"
    assert data["hash_seeds"][0] == data["hash_seeds"][1]  # the divergence reported is under one hash seed
    assert data["first_divergent_step"] == 1 and data["values"][0] != data["values"][1]
    runs = run.stage("concurrency")["details"]["runs"]
    assert [r["hash_seed"] for r in runs] == ["0", "1", "0"]
    # The CPU cannot race a copy: the non_blocking read is reported from the source only.
    [static] = run.findings("nonblocking-race")
    assert located(static) == ("train.py", marker_line("conc_unseeded", "nonblocking-read"))
    assert static["evidence"]["kind"] == "static" and static["severity"] == "medium" and static["blocking"] is False


def test_set_of_strings_diverges_only_across_hash_seeds(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_hashorder", *CONCURRENCY)
    [finding] = run.findings("nondeterminism")
    assert_observed_blocking(finding)
    data = finding["evidence"]["data"]
    assert data["kind"] == "hash-order" and data["hash_seeds"] == ["0", "1"]
    assert data["reproduced_by"].endswith("(PYTHONHASHSEED=0)")
    assert finding["evidence"]["kind"] == "measured"
    curves = run.stage("concurrency")["details"]["checks"]["determinism"]["curves"]
    assert curves[0]["same"] is False


def test_dataset_holding_a_lambda_works_under_fork_and_fails_under_spawn(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_lambda_dataset", *CONCURRENCY)
    # One lambda breaks two loaders: one finding, at the lambda (the fix), listing both loaders.
    [finding] = run.findings("dataloader-hazard")
    assert_observed_blocking(finding)
    data = finding["evidence"]["data"]
    assert data["start_method"] == "spawn" and data["used"] == "fork" and data["batches_under_used"] > 0
    assert data["batch"]["ok"] is False and "pickle" in data["batch"]["error"].lower()
    culprit = data["pickle"]["culprit"]
    assert culprit["attribute"] == "dataset.transform"
    assert culprit["defined_at"]["line"] == marker_line("conc_lambda_dataset", "lambda")
    loader_lines = sorted(loader["site"]["line"] for loader in data["loaders"])
    assert loader_lines == sorted(marker_line("conc_lambda_dataset", m) for m in ("train-loader", "val-loader"))
    assert "2 DataLoaders" in finding["title"]


def test_loop_waiting_for_an_event_nobody_sets_is_a_hang_within_budget(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_hang", *CONCURRENCY)
    assert run.returncode == 1
    [finding] = run.findings("hang")
    assert located(finding) == ("train.py", marker_line("conc_hang", "waits-forever"))
    assert finding["severity"] == "critical" and finding["blocking"] is True
    assert "train.py" in finding["evidence"]["traceback"]
    assert finding["evidence"]["data"]["processes"]
    # The stage keeps its budget (timeout_s = 10); the whole run also holds the gate's wait for
    # the agents' host's imports, which a busy machine stretches and which is bounded apart.
    assert run.stage("concurrency")["duration_s"] <= 10 + 1


def test_documented_amp_loop_with_overflow_guard_is_clean(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_clean_amp", *CONCURRENCY)
    assert run.returncode == 0 and run.report["decision"] == "PASS"
    assert run.findings() == []
    checks = run.stage("concurrency")["details"]["checks"]
    assert checks["gradscaler"]["scalers"][0]["enabled"] is True
    assert checks["gradscaler"]["guarded_skips"] == 1 and "legal" in checks["gradscaler"]["guard_note"]
    assert checks["determinism"]["verdict"].startswith("identical")
    assert checks["nonblocking"]["static_matches"] == []  # host-to-device non_blocking is fine
    assert checks["streams"]["ran"] is False and "cpu" in checks["streams"]["note"]


def test_seeded_loader_with_workers_is_clean_under_fork_and_spawn(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_seeded_loader", *CONCURRENCY)
    loaders = run.stage("concurrency")["details"]["checks"]["dataloader"]
    [loader] = loaders["loaders"]
    assert loader["settings"]["num_workers"] == 2 and loader["batches"] == 3
    [spawn] = loaders["start_method_checks"]
    assert spawn["method"] == "spawn" and spawn["ok"] is True


def test_persistent_loader_recreated_each_epoch_is_a_medium_hazard(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_persistent", *CONCURRENCY)
    [finding] = run.findings("dataloader-hazard")
    assert finding["evidence"]["data"]["constructions"] == 3
    # [tool.traingate.concurrency] dataloader_start_methods = ["fork"]: no spawn check
    assert run.stage("concurrency")["details"]["checks"]["dataloader"]["start_method_checks"] == []


def test_no_entrypoint_skips_the_stage_with_its_reason(shared_gate: Shared) -> None:
    run, _ = shared_gate("conc_no_entrypoint", *CONCURRENCY)
    stage = run.stage("concurrency")
    assert stage["status"] == "skipped" and stage["findings"] == []
    assert "entrypoint" in stage["skipped_reason"]
    assert run.returncode == 1  # nothing ran at all: the gate fails closed
