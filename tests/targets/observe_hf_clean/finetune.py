"""Fine-tuning with a Trainer of the Hugging Face Trainer's shape (minihf, tests/framework_site):
the model's forward returns a dict with "loss", the framework runs the loop over a shuffled
loader it rebuilt; the first layer is kept fixed, the norm and the head train: the clean control."""

import torch
from minihf import Trainer, TrainingArguments
from torch import nn
from torch.utils.data import Dataset


class Points(Dataset):
    def __init__(self, n: int = 256) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 10, generator=generator)
        self.labels = (self.x[:, :3].sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[index], "labels": self.labels[index]}


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 32), nn.LayerNorm(32), nn.GELU())
        self.head = nn.Linear(32, 2)  # marker: head

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        logits = self.head(self.backbone(x))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits, labels)  # marker: loss
        return out


def build_model() -> Classifier:
    torch.manual_seed(0)
    model = Classifier()
    for parameter in model.backbone[0].parameters():
        parameter.requires_grad_(False)
    return model


def finetune(output_dir: str, max_steps: int = 8) -> float:
    args = TrainingArguments(output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=16, learning_rate=1e-2)
    return Trainer(model=build_model(), args=args, train_dataset=Points()).train().training_loss
