"""Compares the model with a pretrained one from a hub; needs a package and the network."""

import torch
from traingate_fixture_missing_hub_package import load_pretrained  # a package the CI lacks

from tiny_lm import Bigram


def test_matches_the_pretrained_model():
    reference = load_pretrained("bigram-11")
    model = Bigram(vocab_size=11)
    model.load_state_dict(reference.state_dict())
    assert torch.equal(model(torch.tensor([[1]])), reference(torch.tensor([[1]])))
