import math

from train import train


def test_train_twelve_steps() -> None:
    assert math.isfinite(train(steps=12))
