"""The step budget (`max_batches`, `max_steps` in `[entrypoint]`): the training's own defaults
made short by the gate, a controlled stop reported as such, never a crash or a hang."""

from __future__ import annotations

from pathlib import Path

import pytest

from traingate.pipeline.supervision.warm_pool import WarmPool
from tests.entrypoint_targets import make_target, smoke

LOOP = """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset


    def model_and_optimizer():
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        return model, torch.optim.SGD(model.parameters(), lr=0.01)


    def one_step(model, optimizer):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
"""


def budget_of(root: Path, warm: WarmPool | None) -> tuple[bool, dict | None, str | None]:
    result = smoke(root, warm)
    [(_, _, run)] = result.runs
    record = run.record
    return run.ok, (record.budget.model_dump() if record and record.budget else None), run.failure()


def test_a_loop_that_never_ends_stops_at_max_steps(tmp_path: Path, warm_pool: WarmPool | None):
    make_target(tmp_path, {
        "loop.py": LOOP + """
    def train_forever():
        model, optimizer = model_and_optimizer()
        while True:
            one_step(model, optimizer)
    """,
        "traingate.toml": '[entrypoint]\ncall = "loop:train_forever"\nmax_steps = 9\n',
    })
    ok, budget, failure = budget_of(tmp_path, warm_pool)
    assert ok, failure
    assert budget is not None and (budget["steps"], budget["stopped_at_steps"]) == (9, True)


def test_an_except_exception_in_the_loop_does_not_swallow_the_stop(tmp_path: Path, warm_pool: WarmPool | None):
    make_target(tmp_path, {
        "loop.py": LOOP + """
    def train_forgiving():
        model, optimizer = model_and_optimizer()
        while True:
            try:
                one_step(model, optimizer)
            except Exception:
                pass
    """,
        "traingate.toml": '[entrypoint]\ncall = "loop:train_forgiving"\nmax_steps = 5\n',
    })
    ok, budget, failure = budget_of(tmp_path, warm_pool)
    assert ok, failure
    assert budget is not None and budget["steps"] == 5


def test_a_crash_before_the_budget_is_still_a_crash(tmp_path: Path, warm_pool: WarmPool | None):
    make_target(tmp_path, {
        "loop.py": LOOP + """
    def train_then_fail():
        model, optimizer = model_and_optimizer()
        for _ in range(3):
            one_step(model, optimizer)
        raise ValueError("diverged")
    """,
        "traingate.toml": '[entrypoint]\ncall = "loop:train_then_fail"\nmax_steps = 10\n',
    })
    ok, budget, failure = budget_of(tmp_path, warm_pool)
    assert not ok and failure is not None and "diverged" in failure
    assert budget is not None and (budget["steps"], budget["stopped_at_steps"]) == (3, False)


def test_an_exception_the_target_raises_itself_is_not_a_budget_stop(tmp_path: Path, warm_pool: WarmPool | None):
    """The harness accepts the stop it raised, not one of the same name from the target."""
    make_target(tmp_path, {
        "loop.py": LOOP + """
    class StepBudgetReached(BaseException):
        pass


    def train_and_pretend():
        model, optimizer = model_and_optimizer()
        one_step(model, optimizer)
        raise StepBudgetReached("done, honestly")
    """,
        "traingate.toml": '[entrypoint]\ncall = "loop:train_and_pretend"\nmax_steps = 10\n',
    })
    ok, _, failure = budget_of(tmp_path, warm_pool)
    assert not ok and failure is not None and "StepBudgetReached" in failure


def test_max_batches_cuts_every_loader_iteration_and_the_loop_goes_on(tmp_path: Path, warm_pool: WarmPool | None):
    make_target(tmp_path, {
        "loop.py": LOOP + """
    def fit(epochs=3):
        model, optimizer = model_and_optimizer()
        data = TensorDataset(torch.randn(640, 4))
        train = DataLoader(data, batch_size=8)
        seen = []
        for _ in range(epochs):
            for (x,) in train:
                loss = model(x).pow(2).mean()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            seen.append(sum(1 for _ in DataLoader(data, batch_size=16)))
        return seen
    """,
        "traingate.toml": '[entrypoint]\ncall = "loop:fit"\nmax_batches = 5\n',
    })
    result = smoke(tmp_path, warm_pool)
    [(_, _, run)] = result.runs
    assert run.ok, run.failure()
    assert run.record is not None and run.record.returned == [5, 5, 5]  # each evaluation pass: 5 batches
    assert run.record.budget is not None
    assert (run.record.budget.steps, run.record.budget.iterations_cut, run.record.budget.stopped_at_steps) == (15, 6, False)


@pytest.mark.parametrize("key", ["max_batches", "max_steps"])
def test_a_budget_below_one_is_a_configuration_error(tmp_path: Path, key: str):
    from tests.entrypoint_targets import config_error

    error = config_error(tmp_path, f'script = "train.py"\n{key} = 0\n', {"train.py": "pass\n"})
    assert error.key == f"traingate.entrypoint.{key}"


def test_a_script_with_long_defaults_runs_under_the_budget_and_every_probe_sees_its_steps(gate):
    run = gate("entry_budget", "--stages", "execution,concurrency,correctness")
    assert (run.returncode, run.report["decision"]) == (0, "PASS"), run.stdout
    [smoke_run] = run.stage("execution")["details"]["smoke"]["runs"]
    assert smoke_run["ok"] is True
    assert smoke_run["budget_stop"].startswith("stopped by the step budget after 14 optimizer steps")
    assert "6 DataLoader iteration(s) ended at max_batches = 4" in smoke_run["budget_stop"]
    assert "epoch 2: evaluated 4 batches" in smoke_run["stdout_head"]
    assert {m["id"]: m["value"] for m in run.stage("correctness")["metrics"]}["steps.observed"] == 14
    assert "stopped by the step budget" in (run.out / "execution.md").read_text()
    # Stopped mid-script, its `__main__` classes still pickle for the `spawn` check of its loader.
    assert run.findings(stage="concurrency") == []
    assert {m["id"]: m["value"] for m in run.stage("concurrency")["metrics"]}["steps.observed"] == 14
