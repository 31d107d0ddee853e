"""Train a character bigram model on a repeating text; configured by --key=value arguments."""

import sys
from contextlib import nullcontext

import torch
from torch import nn

max_iters = 30
dtype = "float32"
device = "cuda" if torch.cuda.is_available() else "cpu"
for arg in sys.argv[1:]:
    key, value = arg.removeprefix("--").split("=")
    globals()[key.replace("-", "_")] = type(globals()[key.replace("-", "_")])(value)

device_type = "cuda" if "cuda" in device else "cpu"
ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "cpu" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)  # marker: device gate

torch.manual_seed(0)
text = torch.arange(4000) * 7 % 29
model = nn.Sequential(nn.Embedding(29, 32), nn.Linear(32, 29)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))


def get_batch() -> tuple[torch.Tensor, torch.Tensor]:
    ix = torch.randint(len(text) - 9, (16,))
    x = torch.stack([text[i : i + 8] for i in ix])
    y = torch.stack([text[i + 1 : i + 9] for i in ix])
    return x.to(device), y.to(device)


for _ in range(max_iters):
    x, y = get_batch()
    with ctx:
        loss = nn.functional.cross_entropy(model(x).view(-1, 29), y.view(-1))  # marker: forward
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
