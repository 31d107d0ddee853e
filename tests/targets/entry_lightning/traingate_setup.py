"""Lightning's Trainer (as `self`), the module and its loader: what `Trainer.fit` is called with."""

import pytorch_lightning as pl

from model import Regressor, loader


def build():
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return {"self": trainer, "model": Regressor(), "train_dataloaders": loader()}
