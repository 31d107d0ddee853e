"""The warm-up rule of ineffective-step on its own: which zero-rate steps are a warm-up's first,
and the loop's own `group["lr"] = ...` line found before the step."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from traingate.stages.correctness.probe.payloads import StepsPayload
from traingate.stages.correctness.warmup import first_steps_only, lr_assignment


def _steps(ineffective: list[dict[str, Any]], steps: int = 10, optimizers: int = 1) -> StepsPayload:
    return StepsPayload.model_validate({
        "steps": steps, "optimizers": [{"class": "SGD", "groups": [{"lr": 0.1, "params": 2}]}] * optimizers,
        "ineffective": ineffective, "ineffective_count": len(ineffective), "step_sites": [], "not_in_optimizer": [], "not_in_optimizer_count": 0,
        "no_gradient": [], "no_gradient_count": 0, "never_changed": [], "never_changed_count": 0, "modules_seen": 3, "non_finite_params": [], "sites": [],
    })


def _zero(step: int, optimizer: int = 0) -> dict[str, Any]:
    return {"step": step, "optimizer": optimizer, "site": None, "lrs": [0.0], "schedulers": [], "grads_present": 2, "params": 2, "cause": "zero-lr"}


def test_only_each_optimizers_first_step_at_rate_zero_is_a_warmup() -> None:
    one = _steps([_zero(0)])
    assert first_steps_only(one, one.ineffective)
    two = _steps([_zero(0, 0), _zero(1, 1)], optimizers=2)  # a GAN's two optimizers, each warming up
    assert first_steps_only(two, two.ineffective)


def test_a_second_zero_step_a_later_one_or_a_run_of_one_step_is_not() -> None:
    for steps in (_steps([_zero(0), _zero(1)]), _steps([_zero(3)]), _steps([_zero(0)], steps=1)):
        assert not first_steps_only(steps, steps.ineffective)


def test_the_loops_lr_assignment_before_the_step_is_found(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "def train(opt, lrs):\n"
        "    for lr in lrs:\n"
        "        for group in opt.param_groups:\n"
        "            group['lr'] = lr\n"
        "        opt.step()\n"
        "    opt.param_groups[0]['lr'] = 0.0\n"
    )
    found = lr_assignment(tmp_path, "train.py", 5)
    assert found is not None and (found.path, found.line, found.function) == ("train.py", 4, "train")
    assert lr_assignment(tmp_path, "train.py", 3) is None and lr_assignment(tmp_path, "missing.py", 5) is None
