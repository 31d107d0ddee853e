def test_module_11_holds():
    assert 11 + 1 == 12
