import math

from loop import train


def test_train_eight_steps() -> None:
    assert math.isfinite(train(steps=8, batch_size=8)["loss"])


def test_train_five_steps_of_larger_batches() -> None:
    assert math.isfinite(train(steps=5, batch_size=16)["loss"])
