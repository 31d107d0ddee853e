"""Used only when the same repo is checked with a hand-written entrypoint (the comparison test):
the framework's Trainer, as `self` of its own `train`."""

from minihf import Trainer, TrainingArguments

from finetune import Points, build_model


def trainer():
    args = TrainingArguments(output_dir="unused", max_steps=8, per_device_train_batch_size=16, learning_rate=1e-2)
    return {"self": Trainer(model=build_model(), args=args, train_dataset=Points())}
