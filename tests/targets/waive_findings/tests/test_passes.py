from scaler import scale


def test_scale_identity():
    assert scale(5.0, 1.0) == 5.0
