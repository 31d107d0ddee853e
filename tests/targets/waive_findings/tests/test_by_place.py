from scaler import scale


def test_scale_by_place():
    assert scale(1.0, 0.5) == 1.0  # planted: fails, waived by category + path
