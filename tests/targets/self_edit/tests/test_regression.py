def test_known_regression_still_fails():
    assert sum([0.1] * 3) == 0.3, "a failing test the conftest deletes from the tree"
