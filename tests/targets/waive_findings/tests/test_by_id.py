from scaler import scale


def test_scale_by_id():
    assert scale(2.0, 3.0) == 7.0  # planted: fails, waived by its finding id
