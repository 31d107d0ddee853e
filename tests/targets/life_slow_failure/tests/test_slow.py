"""A failing test that takes a few seconds: long enough for a second run to collide with it."""

import time


def test_slow_and_failing():
    time.sleep(4)
    assert 1 + 1 == 3  # planted failure
