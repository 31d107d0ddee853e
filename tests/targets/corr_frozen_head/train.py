"""Fine-tuning a "pretrained" backbone with a new classification head: the loop that freezes
the backbone keeps only the norm layers trainable and catches the new head too, so the output
layer stays at its random initialisation while the LayerNorm parameters train."""

import torch
from torch import nn


def backbone() -> nn.Module:
    return nn.Sequential(nn.Linear(12, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 32), nn.LayerNorm(32), nn.GELU())


def train(steps: int = 8, freeze_head: bool = True) -> dict[str, float]:
    torch.manual_seed(0)
    features = backbone()
    features.load_state_dict(backbone().state_dict())  # the pretrained weights
    model = nn.Sequential(features, nn.Linear(32, 5))  # marker: head
    frozen = model if freeze_head else features  # the bug: the whole model, head included
    for module in frozen.modules():
        if not isinstance(module, nn.LayerNorm):  # the norm layers stay trainable
            for p in module.parameters(recurse=False):
                p.requires_grad_(False)  # marker: freeze
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    for step in range(steps):
        x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
        loss = nn.functional.cross_entropy(model(x), y)  # marker: loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()  # a validation pass through the same frozen head: the same cause, one finding
    x, y = torch.randn(16, 12), torch.randint(0, 5, (16,))
    val_loss = nn.functional.cross_entropy(model(x), y)  # marker: val-loss
    return {"loss": loss.item(), "val_loss": val_loss.item()}
