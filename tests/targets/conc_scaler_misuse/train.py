"""Three GradScaler misuses, one per loop; the scaler is disabled off CUDA, so none raises here."""

import torch


def _setup() -> tuple[torch.nn.Module, torch.optim.Optimizer, torch.amp.GradScaler, torch.Tensor, torch.Tensor]:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda", enabled=torch.cuda.is_available())
    return model, optimizer, scaler, torch.randn(8, 4), torch.randn(8, 1)


def bypass(steps: int) -> float:
    model, optimizer, scaler, x, y = _setup()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        optimizer.step()  # marker: step-bypasses-scaler
        scaler.update()
    return loss.item()


def no_update(steps: int) -> float:
    model, optimizer, scaler, x, y = _setup()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)  # marker: missing-update
    return loss.item()


def double_unscale(steps: int) -> float:
    model, optimizer, scaler, x, y = _setup()
    for _ in range(steps):
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.unscale_(optimizer)  # marker: unscale-twice
        scaler.step(optimizer)
        scaler.update()
    return loss.item()


def train(steps: int = 3) -> dict[str, float]:
    return {"bypass": bypass(steps), "no_update": no_update(steps), "double_unscale": double_unscale(steps)}
