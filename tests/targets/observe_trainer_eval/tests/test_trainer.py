import math

from pkg.trainer import Trainer


def test_fit_three_epochs() -> None:
    result = Trainer(batch_size=16).fit(epochs=3)
    assert math.isfinite(result["loss"]) and math.isfinite(result["val"])
