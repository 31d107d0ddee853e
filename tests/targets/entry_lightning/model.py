"""A LightningModule as Lightning repos write them, trained by Lightning's own Trainer.fit
(the real framework: its test is skipped where pytorch_lightning is not installed)."""

import pytorch_lightning as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def loader() -> DataLoader:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(640, 8, generator=generator)
    return DataLoader(TensorDataset(x, x.sum(dim=1, keepdim=True) / 3), batch_size=16, shuffle=True, generator=generator)
