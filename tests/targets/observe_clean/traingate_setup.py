"""Used only when the same repo is checked with a hand-written entrypoint (the comparison test)."""

from trainer import Trainer


def trainer() -> Trainer:
    return Trainer(batch_size=8)
