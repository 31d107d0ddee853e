from scaler import scale


def test_scale_expired():
    assert scale(4.0, 0.25) == 2.0  # planted: fails, its waiver has expired
