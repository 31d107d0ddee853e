def test_module_02_holds():
    assert 2 + 1 == 3
