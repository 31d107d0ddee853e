"""The objects the framework's own `Trainer.fit` is called with: the trainer (as `self`),
the model and the loaders."""

from minifit import Trainer

from data import loaders
from model import Classifier


def build():
    train, val = loaders()
    return {"self": Trainer(max_epochs=2), "model": Classifier(), "train_dataloaders": train, "val_dataloaders": val}
