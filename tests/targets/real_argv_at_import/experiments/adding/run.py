"""The adding problem: predict the sum of the two marked numbers of a sequence."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

parser = argparse.ArgumentParser(description="adding problem")
parser.add_argument("--batch_size", type=int, default=32)
parser.add_argument("--samples", type=int, default=50000)
parser.add_argument("--seq_len", type=int, default=400)
parser.add_argument("--epochs", type=int, default=10)
parser.add_argument("--lr", type=float, default=4e-3)
args = parser.parse_args()

torch.manual_seed(1111)
values = torch.rand(args.samples, 1, args.seq_len)
marks = torch.zeros(args.samples, 1, args.seq_len)
marks[:, 0, 0] = 1
marks[:, 0, -1] = 1
X_train = torch.cat((values, marks), dim=1)
Y_train = values[:, 0, 0:1] + values[:, 0, -1:]
model = nn.Sequential(nn.Conv1d(2, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * args.seq_len, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)


def train(epoch):
    model.train()
    total_loss = 0.0
    for i in range(0, X_train.size(0), args.batch_size):
        x, y = X_train[i : i + args.batch_size], Y_train[i : i + args.batch_size]
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total_loss += loss.item()
    print(f"epoch {epoch}: loss {total_loss:.4f}")


for ep in range(1, args.epochs + 1):
    train(ep)
