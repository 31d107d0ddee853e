"""A stand-in for the Hugging Face Trainer installed beside the target (its shape, plain torch):
`Trainer(model=..., args=TrainingArguments(max_steps=...), train_dataset=...).train()` builds
the optimizer over the parameters that require a gradient, prepares the model, optimizer and a
shuffled loader through an accelerator (miniaccel: a wrapped optimizer, a rebuilt loader),
and runs the loop in its own code: the model's `forward(**batch)` returns a dict whose "loss"
it backpropagates, then it clips, steps, steps the scheduler and clears the gradients."""

from minihf.trainer import Trainer, TrainingArguments, TrainOutput

__all__ = ["Trainer", "TrainOutput", "TrainingArguments"]
