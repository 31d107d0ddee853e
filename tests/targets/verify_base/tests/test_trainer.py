from trainer import descend, mean_error


def test_one_loss_per_step():
    assert len(descend(3, 0.05)) == 3


def test_mean_error_of_the_fit():
    assert mean_error(2.0) < 0.1
