def test_module_10_holds():
    assert 10 + 1 == 11
