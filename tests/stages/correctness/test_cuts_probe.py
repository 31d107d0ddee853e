"""Where an unused parameter's gradient was cut (`probe.cuts`), in-process: a cut is named only
where a detach reached the watched module's own output, never by an id a freed node left behind.
The hooks are called directly, without installing them (installing would patch torch here)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from traingate.stages.correctness.probe.cuts import CutWatch  # noqa: E402
from traingate.stages.harness.sites import SiteTable  # noqa: E402


def _watch(head: Any) -> CutWatch:
    watch = CutWatch(SiteTable(Path(__file__).parent), [(head, None)])
    watch.torch = torch
    watch.watched.add(id(head))
    return watch


def _detach(watch: CutWatch, tensor: Any) -> None:
    def target_line() -> None:  # the frames a detach call comes from: this file is the target's
        watch._reached(tensor, "detach")

    target_line()


def test_a_head_whose_output_reaches_no_loss_is_not_cut_by_a_detach_of_the_loss() -> None:
    """BYOL's shape: the loss reads a hidden layer (a forward hook's), the classifier head's
    output is computed at every step and dropped. Detaching the loss (as a logger does) is no
    cut of the head, though a freed output node's id is soon another node's."""
    torch.manual_seed(0)
    body, head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    watch = _watch(head)
    for _ in range(20):
        hidden = torch.relu(body(torch.randn(3, 4)))
        out = head(hidden)
        watch._after(head, (hidden,), out)
        del out  # nothing uses it
        loss = hidden.pow(2).mean()
        _detach(watch, loss)
        loss.backward()
    assert watch.cuts == {}
    assert watch.describe(head) == {"watched_forward": True, "cut": None, "cut_site": None}


def test_a_detach_of_the_heads_own_output_is_the_cut() -> None:
    body, head = torch.nn.Linear(4, 8), torch.nn.Linear(8, 2)
    watch = _watch(head)
    out = head(torch.relu(body(torch.randn(3, 4))))
    watch._after(head, (), out)
    _detach(watch, out * 2)
    how, site = watch.cuts[id(head)]
    assert how == "detach" and site is not None
