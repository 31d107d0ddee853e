def test_module_04_holds():
    assert 4 + 1 == 5
