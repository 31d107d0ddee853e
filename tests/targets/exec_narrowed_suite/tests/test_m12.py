def test_module_12_holds():
    assert 12 + 1 == 13
