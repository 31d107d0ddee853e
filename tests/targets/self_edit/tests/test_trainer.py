from trainer import sgd_step


def test_step_moves_against_the_gradient():
    assert sgd_step(1.0, 2.0, lr=0.5) == 0.0
