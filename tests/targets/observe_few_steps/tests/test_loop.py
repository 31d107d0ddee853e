import math

from loop import train


def test_one_step() -> None:
    assert math.isfinite(train(steps=1)["loss"])
