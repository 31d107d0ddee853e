def test_module_18_holds():
    assert 18 + 1 == 19
