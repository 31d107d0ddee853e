import pytest

from model import fit


@pytest.fixture
def trained(request: pytest.FixtureRequest):
    return fit(lr=request.param, steps=6 if request.param < 0.01 else 4)
