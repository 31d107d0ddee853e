"""The Trainer's loop, in the framework's code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from miniaccel import Accelerator
from torch.utils.data import DataLoader, Dataset, RandomSampler


@dataclass
class TrainingArguments:
    output_dir: str
    max_steps: int = 8
    per_device_train_batch_size: int = 8
    learning_rate: float = 5e-5
    max_grad_norm: float = 1.0
    seed: int = 42


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float


class Trainer:
    def __init__(self, model: torch.nn.Module, args: TrainingArguments, train_dataset: Dataset[Any]) -> None:
        self.model, self.args, self.train_dataset = model, args, train_dataset
        self.accelerator = Accelerator(cpu=True)

    def get_train_dataloader(self) -> DataLoader[Any]:
        generator = torch.Generator().manual_seed(self.args.seed)
        loader = DataLoader(self.train_dataset, batch_size=self.args.per_device_train_batch_size, sampler=RandomSampler(self.train_dataset, generator=generator))
        return self.accelerator.prepare(loader)

    def create_optimizer(self) -> torch.optim.Optimizer:
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        return torch.optim.AdamW(trainable, lr=self.args.learning_rate)

    def training_step(self, model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        model.train()
        loss = model(**inputs)["loss"]
        self.accelerator.backward(loss)
        return loss.detach()

    def train(self) -> TrainOutput:
        model, optimizer = self.accelerator.prepare(self.model, self.create_optimizer())
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer.optimizer, lambda step: 1.0 - step / (self.args.max_steps + 1))
        total, step = 0.0, 0
        while step < self.args.max_steps:
            for inputs in self.get_train_dataloader():
                total += float(self.training_step(model, inputs))
                torch.nn.utils.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
                optimizer.step()
                scheduler.step()
                model.zero_grad()
                step += 1
                if step >= self.args.max_steps:
                    break
        return TrainOutput(step, total / max(step, 1))
