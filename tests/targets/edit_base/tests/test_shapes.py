from trainer import train


def test_no_steps_no_losses():
    assert train(steps=0) == []
