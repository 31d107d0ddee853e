def test_module_13_holds():
    assert 13 + 1 == 14
