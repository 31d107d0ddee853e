"""A regressor trained by the Gaussian negative log-likelihood of `torch.distributions.Normal`:
the mean is (B,) and the targets (B, 1), so `log_prob` broadcasts to (B, B) and every
prediction is scored against every target."""

import torch
from torch.distributions import Normal


class Regressor(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))

    def forward(self, x: torch.Tensor) -> Normal:
        mean, log_scale = self.body(x).unbind(-1)  # (B,) each
        return Normal(mean, log_scale.exp())


def train(steps: int = 8, squeeze_targets: bool = False) -> dict[str, float]:
    torch.manual_seed(0)
    model = Regressor()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        x, y = torch.randn(16, 6), torch.randn(16, 1)  # targets with a trailing dimension
        if squeeze_targets:
            y = y.squeeze(-1)
        loss = -model(x).log_prob(y).mean()  # marker: log-prob
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    # A mixture scored on purpose against every component: (N, 1) values, 3 components.
    mixture = Normal(torch.zeros(3), torch.ones(3))
    density = mixture.log_prob(torch.randn(16, 1)).logsumexp(-1).mean()
    return {"loss": loss.item(), "density": density.item()}
