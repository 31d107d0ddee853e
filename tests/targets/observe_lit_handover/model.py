"""A module fitted by a Trainer of Lightning 1.x's shape (minilit, tests/framework_site): it
overrides `training_epoch_end`, so the framework keeps every step's output until the epoch
ends. `training_step` returns its logits with their graph: the framework's list holds every
step's graph through the epoch. No entrypoint is configured: the test that fits the module is
the training the gate observes."""

import torch
from minilit import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
        self.epoch_logits: torch.Tensor | None = None

    def training_step(self, batch, batch_idx):
        x, y = batch
        logits = self.net(x)
        loss = nn.functional.cross_entropy(logits, y)
        return {"loss": loss, "logits": logits}  # marker: handover

    def training_epoch_end(self, outputs):
        self.epoch_logits = torch.cat([o["logits"] for o in outputs])

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 10, generator=generator)
    y = (x[:, :3].sum(dim=1) > 0).long() + (x[:, 3] > 1).long()
    return DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=generator)


def trainer(max_steps: int) -> Trainer:
    return Trainer(max_steps=max_steps)


def fit(max_steps: int = 40) -> float:
    torch.manual_seed(0)
    module = Classifier()
    trainer(max_steps).fit(module, train_dataloaders=loader())
    return float(nn.functional.cross_entropy(module.net(torch.randn(8, 10)), torch.zeros(8, dtype=torch.long)))
