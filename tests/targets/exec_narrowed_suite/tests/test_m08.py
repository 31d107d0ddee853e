def test_module_08_holds():
    assert 8 + 1 == 9
