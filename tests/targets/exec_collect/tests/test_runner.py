def test_trivial():
    assert "runner".upper() == "RUNNER"
