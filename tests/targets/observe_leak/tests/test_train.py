import math

from train import train


def test_one_epoch_of_forty_steps() -> None:
    assert math.isfinite(train(steps=40))


def test_two_steps() -> None:
    assert math.isfinite(train(steps=2))
