import math

from train import train


def test_training_returns_a_finite_loss():
    assert math.isfinite(train()["loss"])
