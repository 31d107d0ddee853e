"""A stand-in for a training framework installed beside the target (Lightning's shape): a
module class the user subclasses, and a `Trainer` whose `fit(model, train_dataloaders)` runs
the loop. It is not under the target root, as an installed framework is not; the trainer
lives in a submodule and is re-exported here, as frameworks do."""

from minifit.trainer import Module, Trainer

__all__ = ["Module", "Trainer"]
