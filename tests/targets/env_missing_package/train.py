"""Training that needs a package the CI runner lacks."""

import torch
import traingate_absent_pkg_xyz  # planted: not installed on the runner

from features import featurize

try:  # optional: the code runs without it
    import traingate_absent_optional_pkg  # noqa: F401
except ImportError:
    traingate_absent_optional_pkg = None


def train(steps: int = 4) -> dict[str, float]:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x = featurize(traingate_absent_pkg_xyz.encode(torch.randn(8, 4)))
        loss = model(x).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {"loss": float(loss)}
