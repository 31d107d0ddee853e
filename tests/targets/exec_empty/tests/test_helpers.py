"""Planted: a test module with no tests in it."""


def make_batch(n):
    return list(range(n))
