import math

import torch

from loop import train


def test_model_output_shape() -> None:
    assert torch.nn.Linear(8, 1)(torch.zeros(2, 8)).shape == (2, 1)


def test_train_runs_eight_steps() -> None:
    assert math.isfinite(train(steps=8, batch_size=8)["loss"])
