"""Two classifiers: the second ends its forward in a softmax, so the loop's cross-entropy gets
probabilities where it expects logits (it applies log-softmax itself)."""

import torch


class Classifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class ScoredClassifier(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.body(x), dim=-1)  # marker: softmax
