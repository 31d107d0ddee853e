import math

from train import train


def test_training_returns_a_finite_loss():
    result = train(steps=3, batch_size=4)
    assert math.isfinite(result["loss"])
