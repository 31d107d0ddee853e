"""Planted: a stale test the repo does not run. With `tests = false` pytest never runs it."""


def test_stale():
    assert False, "pytest ran although the configuration declares no test suite"
