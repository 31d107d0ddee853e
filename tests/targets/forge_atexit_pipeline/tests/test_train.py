def test_fails():
    assert 2 + 2 == 5  # the planted failure


def test_imports_own_pipeline():
    import pipeline  # the target's own package: fine here, in the test child

    assert pipeline.HOOKED
