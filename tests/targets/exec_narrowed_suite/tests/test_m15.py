def test_module_15_holds():
    assert 15 + 1 == 16
