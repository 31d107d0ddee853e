import torch

from tiny_lm import Bigram


def test_logits_cover_the_vocabulary():
    model = Bigram(vocab_size=11)
    assert model(torch.tensor([[1, 2, 3]])).shape == (1, 3, 11)
