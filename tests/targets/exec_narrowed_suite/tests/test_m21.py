def test_module_21_holds():
    assert 21 + 1 == 22
