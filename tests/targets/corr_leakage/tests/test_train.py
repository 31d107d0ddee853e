import math

from train import train


def test_training_runs_and_the_loss_is_finite() -> None:
    assert math.isfinite(train(epochs=1)["loss"])
