"""Data-parallel training that trains a separate model on every rank: the weights are seeded
with the rank and the model is never wrapped in DistributedDataParallel, so nothing makes the
ranks agree. The data is sharded correctly."""

import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(steps: int = 4) -> dict[str, float]:
    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    data = TensorDataset(torch.randn(64, 4, generator=torch.Generator().manual_seed(1)), torch.randn(64, 1, generator=torch.Generator().manual_seed(2)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    torch.manual_seed(1234 + rank)  # marker: seed
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))  # marker: model
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for _step, (x, y) in zip(range(steps), loader):
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if distributed:
        dist.destroy_process_group()
    return {"loss": loss.item()}
