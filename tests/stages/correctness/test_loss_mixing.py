"""loss-input-mismatch and batch-mixing end to end: one `traingate run --stages correctness` per
fixture target, shared by the assertions on its report; expected lines come from `# marker:`
comments."""

from __future__ import annotations


import pytest

from tests.correctness_runs import checks as _checks
from tests.correctness_runs import CORRECTNESS, Shared
from tests.correctness_runs import located as _located
from tests.correctness_runs import marker as _marker
from tests.correctness_runs import site as _site

pytestmark = pytest.mark.slow


def test_probabilities_into_cross_entropy_block_at_the_loss_naming_the_softmax(shared_gate: Shared) -> None:
    softmax = shared_gate("corr_loss_softmax", *CORRECTNESS)[0]
    assert softmax.returncode == 1 and softmax.report["decision"] == "BLOCK"
    [finding] = softmax.findings()
    assert finding["category"] == "loss-input-mismatch" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_loss_softmax", "loss")
    data = finding["evidence"]["data"]
    assert data["function"] == "cross_entropy" and data["input_kind"] == "probabilities" and data["gradients_recorded"] is True
    assert data["module"] == "Softmax" and _site(data["module_site"]) == _marker("corr_loss_softmax", "softmax")


def test_the_softmax_classifier_batch_is_charted_clean(shared_gate: Shared) -> None:
    softmax = shared_gate("corr_loss_softmax", *CORRECTNESS)[0]
    # (8, 8) inputs: the DataLoader's batch shape says which 8 is the batch.
    check = _checks(softmax)["batch_mixing"]
    assert check["ran"] is True and check["mixed"] is False and check["batch_dim"] == 0


def test_logits_into_cross_entropy_log_softmax_into_nll_and_logits_into_bce_pass(shared_gate: Shared) -> None:
    logits = shared_gate("corr_loss_logits", *CORRECTNESS)[0]
    assert logits.returncode == 0 and logits.report["decision"] == "PASS" and logits.findings() == []
    check = _checks(logits)["loss_input_mismatch"]
    assert check["ran"] is True and check["mismatches"] == 0
    assert {(line["function"], line["kind"]) for line in check["lines"]} == {
        ("cross_entropy", "logits"), ("nll_loss", "log-probabilities"), ("binary_cross_entropy_with_logits", "logits")
    }


def test_view_instead_of_transpose_blocks_at_the_gru_naming_the_view(shared_gate: Shared) -> None:
    mixed = shared_gate("corr_batch_mixing", *CORRECTNESS)[0]
    assert mixed.returncode == 1 and mixed.report["decision"] == "BLOCK"
    [finding] = mixed.findings()
    assert finding["category"] == "batch-mixing" and finding["severity"] == "high" and finding["blocking"] is True
    assert _located(finding) == _marker("corr_batch_mixing", "mix")
    data = finding["evidence"]["data"]
    assert data["mixing_op"]["name"] == "gru" and data["layout_op"]["name"] == "view"
    assert _site(data["layout_op"]["site"]) == _marker("corr_batch_mixing", "layout")
    assert _site(data["model_site"]) == _marker("corr_batch_mixing", "forward")
    assert data["batch_size"] == 8 and data["batch_dim"] == 0 and data["batch_dim_assumed"] is False
    assert all(d["others_count"] > 0 and d["largest_other_gradient"] > 0 for d in data["dependencies"])


def test_transpose_with_batchnorm_passes_and_says_what_it_charted(shared_gate: Shared) -> None:
    transposed = shared_gate("corr_batch_mixing_clean", *CORRECTNESS)[0]
    assert transposed.returncode == 0 and transposed.report["decision"] == "PASS" and transposed.findings() == []
    check = _checks(transposed)["batch_mixing"]
    assert check["ran"] is True and check["mixed"] is False and check["samples_judged"] == [0, 7]
    assert _site(check["site"]) == _marker("corr_batch_mixing_clean", "forward")
    # No BCE/NLL/softmax here, but a cross_entropy call on logits: judged, and clean.
    assert _checks(transposed)["loss_input_mismatch"]["mismatches"] == 0
