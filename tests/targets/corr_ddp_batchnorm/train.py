"""Planted: DistributedDataParallel with `broadcast_buffers=False` around a model with
BatchNorm. The gradients are averaged, so the weights stay identical, but nothing
synchronises the running statistics: each rank's BatchNorm tracks its own share of the data,
and the model rank 0 saves is evaluated with statistics the other ranks never had."""

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(steps: int = 4) -> dict[str, float]:
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    data = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(1)), torch.randn(64, 1, generator=torch.Generator().manual_seed(2)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8, bias=False),  # a bias before BatchNorm never learns (its gradient is 0)
        torch.nn.BatchNorm1d(8),  # marker: batchnorm
        torch.nn.ReLU(),
        torch.nn.Linear(8, 1),
    )
    if distributed:
        model = DistributedDataParallel(model, broadcast_buffers=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    sampler.set_epoch(0)
    for _step, (x, y) in zip(range(steps), loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if distributed:
        dist.destroy_process_group()
    return {"loss": loss.item()}
