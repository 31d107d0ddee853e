from trainer import fit


def test_no_points_no_crash_on_zero_steps():
    assert fit([(1.0, 1.0)], steps=0) == []
