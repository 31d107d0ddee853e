import torch

import stages.prep
from train import train


def test_standardize_centres_each_feature():
    out = stages.prep.standardize(torch.randn(64, 3) * 5 + 2)
    assert torch.allclose(out.mean(dim=0), torch.zeros(3), atol=1e-5)


def test_batches_have_the_requested_count():
    assert len(stages.prep.make_batches(4, batch_size=2)) == 4


def test_training_runs():
    assert train(steps=3) >= 0.0
