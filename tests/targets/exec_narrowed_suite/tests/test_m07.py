def test_module_07_holds():
    assert 7 + 1 == 8
