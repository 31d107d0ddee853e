"""A nanoGPT-style loop whose linear warm-up gives lr = 0 at iteration 0: the first
optimizer step changes nothing."""

import math

import torch

learning_rate, warmup_iters, lr_decay_iters, min_lr = 1e-2, 4, 40, 1e-3


def get_lr(it: int) -> float:
    if it < warmup_iters:
        return learning_rate * it / warmup_iters
    ratio = (it - warmup_iters) / (lr_decay_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


def train(max_iters: int = 12) -> dict[str, float]:
    model = torch.nn.Sequential(torch.nn.Embedding(32, 8), torch.nn.Flatten(), torch.nn.Linear(32, 32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    for it in range(max_iters):
        lr = get_lr(it)
        for group in optimizer.param_groups:
            group["lr"] = lr  # marker: lr
        tokens = torch.randint(0, 32, (8, 4))
        loss = torch.nn.functional.cross_entropy(model(tokens), tokens[:, 0])
        loss.backward()
        optimizer.step()  # marker: step
        optimizer.zero_grad(set_to_none=True)
    return {"loss": loss.item()}
