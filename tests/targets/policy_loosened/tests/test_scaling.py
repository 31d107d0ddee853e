from scaling import scale_loss


def test_scale_loss_multiplies():
    assert scale_loss(2.0, 4.0) == 8.0


def test_scale_of_one_keeps_the_loss():
    assert scale_loss(3.0, 1.0) == 3.0
