"""Data-parallel training whose DataLoader has no DistributedSampler: the model is wrapped in
DistributedDataParallel, but every rank iterates the whole dataset in the same shuffled order
(one seeded generator), so the ranks compute the same gradients."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset


def train(steps: int = 4) -> dict[str, float]:
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group()
    data = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(1)), torch.randn(64, 1, generator=torch.Generator().manual_seed(2)))
    loader = DataLoader(data, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(0))  # marker: loader
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    if distributed:
        model = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _step, (x, y) in zip(range(steps), loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if distributed:
        dist.destroy_process_group()
    return {"loss": loss.item()}
