import math

from train import train


def test_train_takes_its_steps():
    assert train(steps=2)["steps"] == 2


def test_final_loss_is_finite():
    assert math.isfinite(train(steps=3)["final_loss"])
