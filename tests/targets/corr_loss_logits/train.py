"""The clean control of corr_loss_softmax: the model returns logits, CrossEntropyLoss gets them,
and the softmax is applied only for predictions; a second head trains with log_softmax into
nll_loss and a third with logits into BCEWithLogitsLoss."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class Classifier(torch.nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
        self.classes = torch.nn.Linear(16, classes)
        self.flag = torch.nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.classes(h), self.flag(h).squeeze(-1)


def train(steps: int = 8, batch_size: int = 8) -> dict[str, float]:
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 4, (256,)))
    loader = DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = Classifier()
    criterion, flag_criterion = torch.nn.CrossEntropyLoss(), torch.nn.BCEWithLogitsLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(loader)
    for _ in range(steps):
        x, y = next(batches)
        logits, flag = model(x)
        loss = criterion(logits, y)  # marker: loss
        loss = loss + torch.nn.functional.nll_loss(torch.log_softmax(logits, dim=-1), y)
        loss = loss + flag_criterion(flag, (y > 1).float())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = torch.softmax(model(x)[0], dim=-1).argmax(dim=-1)
    return {"loss": loss.item(), "accuracy": (predicted == y).float().mean().item()}
