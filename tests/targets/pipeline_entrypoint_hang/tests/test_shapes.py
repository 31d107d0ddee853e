import torch


def test_linear_shape() -> None:
    assert torch.nn.Linear(2, 1)(torch.zeros(3, 2)).shape == (3, 1)
