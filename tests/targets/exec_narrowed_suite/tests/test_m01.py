def test_module_01_holds():
    assert 1 + 1 == 2
