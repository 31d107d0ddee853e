def test_module_03_holds():
    assert 3 + 1 == 4
