import math

from model import fit


def test_fit_forty_steps() -> None:
    assert math.isfinite(fit(max_steps=40))
