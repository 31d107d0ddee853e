def test_module_06_holds():
    assert 6 + 1 == 7
