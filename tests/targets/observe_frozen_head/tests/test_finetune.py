import math

from finetune import finetune


def test_finetune_a_few_steps() -> None:
    assert math.isfinite(finetune(steps=8)["loss"])
