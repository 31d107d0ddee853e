"""Training loops of Hugging Face Accelerate's, the Hugging Face Trainer's and Lightning's
shapes, observed through the tests that run them (no entrypoint configured), get the verdicts
a hand-written entrypoint gets, with findings at the user's lines, never in the framework's.

The frameworks are stand-ins of plain torch installed beside the target (tests/framework_site,
on PYTHONPATH, outside the target root as site-packages are): `miniaccel` wraps the optimizer
in a `torch.optim.Optimizer` subclass that delegates `step` and rebuilds the loader around its
batch sampler; `minihf` runs the loop in its own code over the model's `{"loss": ...}`;
`minilit` steps a wrapper with a closure, so the user's `training_step` runs inside the
optimizer's `step`, and calls the module's epoch hook after it set train mode. Each case has a
planted defect and a clean control.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import TARGETS, GateRun, line_of, serving_this_environment
from tests.observed_vs_configured import Case, assert_found_at_markers, assert_same_verdict, observed_or_configured, places
from tests.paths import FRAMEWORK_SITE


# case: (stages, the hand-written entrypoint making the test's call, the observed test,
#        expected findings as (category, file, marker))
CASES: dict[str, Case] = {
    "observe_accelerate_stale": (
        "execution,correctness",
        'call = "train:train"\nkwargs = { steps = 12 }',
        "tests/test_train.py::test_train_twelve_steps",
        [("stale-gradients", "train.py", "marker: step")],
    ),
    "observe_accelerate_clean": (
        "execution,correctness",
        'call = "train:train"\nkwargs = { steps = 12 }',
        "tests/test_train.py::test_train_twelve_steps",
        [],
    ),
    "observe_hf_frozen_head": (
        "execution,correctness",
        'call = "minihf:Trainer.train"\nsetup = "traingate_setup:trainer"',
        "tests/test_finetune.py::test_trainer_runs_eight_steps",
        [("unused-parameter", "finetune.py", "marker: freeze")],
    ),
    "observe_hf_clean": (
        "execution,correctness",
        'call = "minihf:Trainer.train"\nsetup = "traingate_setup:trainer"',
        "tests/test_finetune.py::test_trainer_runs_eight_steps",
        [],
    ),
    "observe_lit_leak": (
        "execution,performance",
        'call = "minilit:Trainer.fit"\nsetup = "traingate_setup:build"',
        "tests/test_model.py::test_fit_forty_steps",
        [("memory-leak", "model.py", "marker: leak")],
    ),
    "observe_lit_handover": (
        "execution,performance",
        'call = "minilit:Trainer.fit"\nsetup = "traingate_setup:build"',
        "tests/test_model.py::test_fit_forty_steps",
        [("memory-leak", "model.py", "marker: handover")],
    ),
    "observe_lit_eval": (
        "execution,correctness",
        'call = "minilit:Trainer.fit"\nsetup = "traingate_setup:build"',
        "tests/test_model.py::test_fit_forty_steps",
        [("train-eval-mode", "model.py", "marker: eval")],
    ),
    "observe_lit_clean": (
        "execution,performance",
        'call = "minilit:Trainer.fit"\nsetup = "traingate_setup:build"',
        "tests/test_model.py::test_fit_forty_steps",
        [],
    ),
}


@pytest.fixture(scope="module", autouse=True)
def framework_installed() -> Iterator[None]:
    """The stand-in frameworks importable in every process the gate starts, as installed ones are."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(FRAMEWORK_SITE), os.environ.get("PYTHONPATH", "")) if p))
        with serving_this_environment():
            yield


@pytest.fixture(scope="module")
def runs(shared_gate: Callable[..., tuple[GateRun, float]], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, bool], GateRun]:
    return observed_or_configured(CASES, shared_gate, tmp_path_factory)


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_frameworks_loop_observed_in_its_test_gets_the_verdict_of_a_hand_written_entrypoint(runs: Callable[[str, bool], GateRun], case: str) -> None:
    assert_same_verdict(runs(case, False), runs(case, True), CASES[case][0])


@pytest.mark.parametrize("case", sorted(CASES))
def test_findings_are_at_the_users_lines_never_in_the_framework(runs: Callable[[str, bool], GateRun], case: str) -> None:
    _, _, test, expected = CASES[case]
    run = runs(case, False)
    assert_found_at_markers(run, case, test, expected)
    assert all(not (path or "").startswith(("..", "/")) for _, path, _ in places(run))


def test_what_a_framework_keeps_without_a_graph_is_low_and_located_where_the_repo_hands_it(shared_gate: Callable[..., tuple[GateRun, float]]) -> None:
    """observe_lit_handover's fix: the logits handed over detached. The framework still keeps
    every step's output until the epoch ends (its design), so memory grows, but no graph: low."""
    run, _ = shared_gate("observe_lit_handover_clean", "--stages", "execution,performance")
    assert run.report["decision"] == "PASS", run.stdout
    [kept] = [f for f in run.findings() if f["category"] == "memory-leak"]
    assert (kept["severity"], kept["location"]["path"], kept["location"]["line"]) == ("low", "model.py", line_of(TARGETS / "observe_lit_handover_clean" / "model.py", "marker: handover"))
    assert "outside the repo (a framework's)" in kept["problem"] and "no autograd graph" in kept["problem"]


# -- the shapes themselves, without a gate run ------------------------------------------------


def test_a_loader_rebuilt_around_a_shuffling_batch_sampler_is_judged_by_the_sampler_it_draws_from() -> None:
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from traingate.stages.correctness.probe.loaders import _ordering

    data = TensorDataset(torch.arange(32.0))
    shuffled = DataLoader(data, batch_size=4, shuffle=True)
    rebuilt = DataLoader(data, batch_sampler=shuffled.batch_sampler)  # Accelerate's `prepare`
    assert type(rebuilt.sampler).__name__ == "SequentialSampler"  # kept, never drawn from
    assert _ordering(rebuilt, {})["sampler"] == _ordering(shuffled, {})["sampler"] == "RandomSampler"
    assert _ordering(DataLoader(data, batch_size=4), {})["sampler"] == "SequentialSampler"
    assert _ordering(DataLoader(data, batch_sampler=DataLoader(data, batch_size=4).batch_sampler), {})["sampler"] == "SequentialSampler"


def test_init_reads_a_fit_on_a_trainer_held_in_a_name_of_any_spelling(tmp_path: Path) -> None:
    from traingate.pipeline.gate.init_scan import scan

    (tmp_path / "model.py").write_text(
        "import lightning as L\n\n"
        "def trainer(max_steps):\n    return L.Trainer(max_steps=max_steps)\n\n"
        "def fit(max_steps=40):\n    t = trainer(max_steps)\n    t.fit(object())\n\n"
        "def fit_direct():\n    t = L.Trainer(max_steps=4)\n    t.fit(object())\n\n"
        "def evaluate(model):\n    m = model\n    m.fit(object())\n"
    )
    trains = {f.qualname: f.trains for f in scan(tmp_path).functions}
    assert (trains["fit"], trains["fit_direct"], trains["evaluate"]) == ("fit", "fit", None)
