def test_module_05_holds():
    assert 5 + 1 == 6
