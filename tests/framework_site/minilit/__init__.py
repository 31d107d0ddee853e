"""A stand-in for Lightning installed beside the target (its automatic optimization, plain
torch): `Trainer(max_steps=...).fit(module, train_dataloaders=...)` wraps the module's
optimizer in a `LightningOptimizer` (not an optimizer itself: it delegates `step`) and steps
it with a closure, so the user's `training_step`, the clearing of the gradients and the
backward pass all run inside the optimizer's `step`, as Lightning runs them; each epoch starts
with the module's `on_train_epoch_start` hook, after the trainer set train mode."""

from minilit.trainer import LightningModule, LightningOptimizer, Trainer

__all__ = ["LightningModule", "LightningOptimizer", "Trainer"]
