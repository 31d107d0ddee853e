import shutil

import pytest

from trainer import fit

POINTS = [(1.0, 2.0), (2.0, 4.1), (3.0, 5.9)]


def test_loss_decreases():
    losses = fit(POINTS, steps=5)
    assert losses[-1] < losses[0]


def test_one_loss_per_step():
    assert len(fit(POINTS, steps=3)) == 3


@pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs a CUDA runner")
def test_on_gpu():
    assert fit(POINTS, steps=1)
