"""A dataset that only works in the main process: its workers raise at their first sample, so
the training stops at its first batch and there is no training to compare between runs."""

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, get_worker_info


class Samples(Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if get_worker_info() is not None:
            raise ValueError("sample store not opened in this process")  # marker: worker-raises
        return torch.full((4,), float(index)), torch.tensor([float(index % 2)])


def train(steps: int = 4) -> dict:
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Samples(), batch_size=8, shuffle=True, num_workers=1)
    loss = torch.zeros(())
    for x, y in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return {"loss": float(loss)}
