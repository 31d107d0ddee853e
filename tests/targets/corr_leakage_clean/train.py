"""A validation set drawn from another permutation than the training set: two `random_split`
calls, each with its own generator, so most validation samples are also trained on. The
train-accuracy pass over the training subset is on purpose."""

import torch
from torch.utils.data import DataLoader, TensorDataset, random_split


def splits(data: TensorDataset, split_once: bool) -> tuple[torch.utils.data.Dataset, torch.utils.data.Dataset]:
    if split_once:
        train_set, val_set = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(1))
        return train_set, val_set
    train_set, _ = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(1))
    _, val_set = random_split(data, [0.8, 0.2], generator=torch.Generator().manual_seed(2))
    return train_set, val_set


def train(epochs: int = 2, split_once: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    features = torch.randn(120, 10)
    data = TensorDataset(features, (features[:, 0] > 0).long())
    train_set, val_set = splits(data, split_once)
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True)  # marker: train-loader
    val_loader = DataLoader(val_set, batch_size=32)  # marker: val-loader
    train_eval_loader = DataLoader(train_set, batch_size=32)
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)
    for epoch in range(epochs):
        model.train()
        for x, y in train_loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            val_accuracy = sum((model(x).argmax(1) == y).sum().item() for x, y in val_loader) / len(val_set)
            train_accuracy = sum((model(x).argmax(1) == y).sum().item() for x, y in train_eval_loader) / len(train_set)
    return {"loss": loss.item(), "val_accuracy": val_accuracy, "train_accuracy": train_accuracy}
