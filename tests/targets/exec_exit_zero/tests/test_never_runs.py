def test_would_fail():
    assert False
