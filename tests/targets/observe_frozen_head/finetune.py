"""Fine-tuning a "pretrained" backbone with a new head: the loop that freezes the backbone
keeps only the norm layers trainable and catches the new head too."""

import torch
from torch import nn


def backbone() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU())


def finetune(steps: int = 8) -> dict[str, float]:
    torch.manual_seed(0)
    features = backbone()
    model = nn.Sequential(features, nn.Linear(32, 5))  # marker: head
    for module in model.modules():  # the bug: the whole model, head included
        if not isinstance(module, nn.LayerNorm):
            for p in module.parameters(recurse=False):
                p.requires_grad_(False)  # marker: freeze
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(steps):
        x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
        loss = nn.functional.cross_entropy(model(x), y)  # marker: loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {"loss": loss.item()}
