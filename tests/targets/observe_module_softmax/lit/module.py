"""A module in the style of a Lightning module (training_step, configure_optimizers) whose model
ends in a Softmax, trained with cross-entropy: the loss takes probabilities, not logits."""

import torch


class LitClassifier(torch.nn.Module):
    def __init__(self, classes: int = 4) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))
        self.probabilities = torch.nn.Softmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.probabilities(self.body(x))  # marker: softmax

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.cross_entropy(self(x), y)  # marker: loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)
