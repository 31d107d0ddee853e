from train import train


def test_train_runs():
    assert train(steps=1)["loss"] >= 0
