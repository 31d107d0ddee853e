def test_module_20_holds():
    assert 20 + 1 == 21
