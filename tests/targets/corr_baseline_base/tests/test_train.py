from train import train


def test_trains_for_each_epoch():
    assert len(train(epochs=2)) == 2


def test_loss_is_finite():
    assert all(loss == loss for loss in train(epochs=1))
