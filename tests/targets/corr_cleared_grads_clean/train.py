"""A regression loop whose `model.zero_grad()` sits between `backward()` and `step()`: every
step finds the gradients cleared, and no step changes the model."""

import torch


def train(steps: int = 6, clear_late: bool = True) -> dict[str, float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.GELU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    data = torch.utils.data.TensorDataset(torch.randn(48, 5), torch.randn(48, 2))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    for step, (x, y) in zip(range(steps), loader):
        if not clear_late:
            model.zero_grad()
        loss = torch.nn.functional.smooth_l1_loss(model(x), y)
        loss.backward()  # marker: backward
        if clear_late:
            model.zero_grad()  # marker: clear
        optimizer.step()  # marker: step
    return {"loss": loss.item()}
