import math

from regressor import train_regressor


def test_regressor_trains_four_steps() -> None:
    assert math.isfinite(train_regressor(steps=4)["loss"])
