"""Two training loaders that repeat one order every epoch: one without shuffle=True (a
SequentialSampler), one with a DistributedSampler whose set_epoch is never called. The
validation loader is sequential too, as it should be: it drives no optimizer step."""

import torch
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train(epochs: int = 2) -> dict[str, float]:
    data = TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
    plain = DataLoader(data, batch_size=8)  # marker: sequential
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True)
    sharded = DataLoader(data, batch_size=8, sampler=sampler)  # marker: distributed
    validation = DataLoader(data, batch_size=8)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for loader in (plain, sharded):
        for _ in range(epochs):
            for x, y in loader:
                loss = torch.nn.functional.mse_loss(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    with torch.no_grad():
        val = sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in validation)
    return {"loss": loss.item(), "val": val}
