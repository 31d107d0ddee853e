"""A module fitted by a Trainer of Lightning's shape (minilit, tests/framework_site): the user's
`training_step` runs inside the optimizer's step, through the framework's closure; it counts
its steps and keeps no loss: the clean control."""

import torch
from minilit import LightningModule, Trainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Classifier(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 3))
        self.steps_seen = 0

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        self.steps_seen += 1
        return loss

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
