def test_module_09_holds():
    assert 9 + 1 == 10
