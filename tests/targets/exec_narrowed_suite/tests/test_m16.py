def test_module_16_holds():
    assert 16 + 1 == 17
