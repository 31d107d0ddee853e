"""Learn the energy of a damped oscillator, E = (m v^2 + k x^2) / 2 * exp(-c t), from its state
with a small MLP in float64, as scientific code does: its parameters, data, gradients and loss
are all double precision."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class Surrogate(torch.nn.Module):
    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(5, width), torch.nn.Tanh(), torch.nn.Linear(width, width), torch.nn.Tanh())
        self.head = torch.nn.Linear(width, 1)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(state)).squeeze(-1)


def samples(count: int = 256, seed: int = 0) -> TensorDataset:
    """States (m, k, x, v, t) and their energies."""
    generator = torch.Generator().manual_seed(seed)
    state = torch.rand(count, 5, generator=generator, dtype=torch.float64) * 1.5 + 0.5
    m, k, x, v, t = state.unbind(-1)
    energy = 0.5 * (m * v**2 + k * x**2) * torch.exp(-0.1 * t)
    return TensorDataset(state, energy)


def train(steps: int = 24, batch_size: int = 8, grad_accum_steps: int = 1) -> dict[str, float]:
    loader = DataLoader(samples(), batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
    model = Surrogate().double()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    batches = iter(loader)
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        for _ in range(grad_accum_steps):
            try:
                state, energy = next(batches)
            except StopIteration:
                batches = iter(loader)
                state, energy = next(batches)
            loss = torch.nn.functional.mse_loss(model(state), energy) / grad_accum_steps
            loss.backward()
        optimizer.step()
    return {"loss": loss.item(), "fit": fit_error(model), "dtype": str(next(model.parameters()).dtype)}


def fit_error(model: Surrogate) -> float:
    """Mean squared error over the whole data set."""
    state, energy = samples()[:]
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(state), energy).item()
