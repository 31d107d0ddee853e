def test_module_14_holds():
    assert 14 + 1 == 15
