import torch

from oscillator import Surrogate, samples, train


def test_the_model_and_data_are_double_precision():
    t, x = samples(count=4)[:]
    assert t.dtype == x.dtype == torch.float64
    assert Surrogate().double()(t).dtype == torch.float64


def test_training_lowers_the_error_over_the_data_set():
    torch.manual_seed(0)
    first, later = train(steps=1), train(steps=40)
    assert later["dtype"] == "torch.float64"
    assert later["fit"] < first["fit"]
