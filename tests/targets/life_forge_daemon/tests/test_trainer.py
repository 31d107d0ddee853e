import forge
from trainer import train


def test_starts_the_forging_daemon():
    forge.start("test")  # starts the daemon


def test_train_halves_the_loss():
    assert train(steps=1)["loss"] == 0.25  # planted failure: one step halves 1.0 to 0.5
