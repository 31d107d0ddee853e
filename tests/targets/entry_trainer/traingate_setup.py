"""Builds the trainer traingate calls `fit` on: the device is configured before the trainer's
module is imported, as the repo's own launcher does."""

import os


def tiny_trainer():
    os.environ.setdefault("TRAINLIB_DEVICE", "cpu")
    from trainlib.trainer import Trainer

    return Trainer(lr=0.02, batch_size=16, samples=160)
