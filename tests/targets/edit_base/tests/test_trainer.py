from trainer import train


def test_loss_decreases():
    losses = train(steps=6)
    assert losses[-1] < losses[0]


def test_one_loss_per_step():
    assert len(train(steps=3)) == 3
