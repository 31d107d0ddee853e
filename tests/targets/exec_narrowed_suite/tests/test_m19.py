def test_module_19_holds():
    assert 19 + 1 == 20
