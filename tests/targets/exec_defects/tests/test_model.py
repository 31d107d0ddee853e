import pytest
import torch


def test_addition_passes():
    assert torch.ones(2).sum().item() == 2


def test_shape_is_transposed():
    x = torch.zeros(2, 3)
    # A message as a terminal shows it (bold, two lines, a pipe): report tables must stay whole.
    assert x.shape == (3, 2), "\x1b[1mshape | mismatch\x1b[0m\nexpected (3, 2)"  # planted: fails


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA not available")
@pytest.mark.parametrize("size", [1, 2, 3])
def test_on_gpu(size):
    assert torch.ones(size, device="cuda").sum().item() == size


def test_full_dataset():
    pytest.skip("needs the full dataset")


@pytest.mark.xfail(reason="known rounding issue", strict=True)
def test_known_issue():
    assert 0.1 + 0.2 == 0.3


def test_autocast_context():
    with torch.cuda.amp.autocast(enabled=False):  # planted: deprecated API
        y = torch.ones(2) * 2
    assert y.sum().item() == 4
