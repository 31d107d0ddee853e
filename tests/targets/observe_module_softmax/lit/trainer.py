"""A small trainer in the style of Lightning's: `fit(module, loader)` runs `max_steps` steps."""

import torch
from torch.utils.data import DataLoader, TensorDataset


class MiniTrainer:
    def __init__(self, max_steps: int = 8) -> None:
        self.max_steps = max_steps

    def fit(self, module: torch.nn.Module, loader: DataLoader) -> float:
        optimizer = module.configure_optimizers()
        module.train()
        step = 0
        while step < self.max_steps:
            for batch in loader:
                loss = module.training_step(batch)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                step += 1
                if step == self.max_steps:
                    break
        return float(loss)


def loader(batch_size: int = 8) -> DataLoader:
    data = TensorDataset(torch.randn(256, 8), torch.randint(0, 4, (256,)))
    return DataLoader(data, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(0))
