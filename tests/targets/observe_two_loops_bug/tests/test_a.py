import math

from classifier import train_classifier


def test_classifier_trains_six_steps() -> None:
    assert math.isfinite(train_classifier(steps=6)["loss"])
