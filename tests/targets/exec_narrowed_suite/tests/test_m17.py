def test_module_17_holds():
    assert 17 + 1 == 18
