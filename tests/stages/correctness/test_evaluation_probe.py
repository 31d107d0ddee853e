"""The training facts' evaluation check (stages/correctness/probe/evaluation.py), called as the
global forward hook would call it: a model under no_grad is run again on the same input; dropout
left on gives another output, eval mode the same; the run after the check is the run without it
(random state and buffers restored)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from traingate.stages.harness.sites import SiteTable
from traingate.stages.correctness.probe.evaluation import MAX_CHECKS, EvaluationWatch


def watch(tmp_path: Path) -> EvaluationWatch:
    found = EvaluationWatch(SiteTable(tmp_path))
    found.torch = torch
    return found


def evaluated(found: EvaluationWatch, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        output = model(x)
        found._exit(model, (x,), {}, output)
    return output


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.BatchNorm1d(16), nn.Linear(16, 2))


def test_dropout_left_on_gives_another_output_and_eval_mode_the_same(tmp_path: Path) -> None:
    found, net, x = watch(tmp_path), model(), torch.randn(4, 8)
    net.eval()
    evaluated(found, net, x)
    net.train()
    evaluated(found, net, x)
    assert found.collect() == {"checked": 2, "deterministic": 1, "eval_mode": 1, "site": None}


def test_the_run_after_the_check_is_the_run_without_it(tmp_path: Path) -> None:
    net, x = model(), torch.randn(4, 8)
    net.train()
    torch.manual_seed(1)
    with torch.no_grad():
        net(x)
    expected = (torch.rand(3), net[2].running_mean.clone())
    net = model()
    torch.manual_seed(1)
    evaluated(watch(tmp_path), net, x)
    assert torch.equal(torch.rand(3), expected[0]) and torch.equal(net[2].running_mean, expected[1])


def test_under_grad_and_past_the_limit_nothing_is_checked(tmp_path: Path) -> None:
    found, net, x = watch(tmp_path), model().eval(), torch.randn(4, 8)
    found._exit(net, (x,), {}, net(x))  # gradients recorded: a training forward
    assert found.collect() is None
    for _ in range(MAX_CHECKS + 2):
        evaluated(found, net, x)
    assert found.checked == MAX_CHECKS
