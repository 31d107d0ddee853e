import math

from finetune import finetune


def test_trainer_runs_eight_steps(tmp_path) -> None:
    assert math.isfinite(finetune(str(tmp_path), max_steps=8))
