from forger import forge


def test_fails():
    assert 1 + 1 == 3  # the planted failure


def test_covers_up():
    forge("tests/test_forge.py::test_fails", rewrite=False)
