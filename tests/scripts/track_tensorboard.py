"""Train a small classifier and log its loss to TensorBoard, as PyTorch's
TensorBoard tutorial does: a SummaryWriter at the top of the script,
`add_scalar` at each step's `global_step`, flushed and closed at the end.

`--library tensorboardX` writes with tensorboardX's SummaryWriter instead;
`--no-close` only flushes it, leaving it open at exit.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--logdir", required=True)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--library", choices=("torch", "tensorboardX"), default="torch")
parser.add_argument("--no-close", action="store_true")
args = parser.parse_args()
if args.library == "torch":
    from torch.utils.tensorboard import SummaryWriter
else:
    from tensorboardX import SummaryWriter

writer = SummaryWriter(args.logdir)

torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(640, 20)
y = (x[:, :10].sum(dim=1) > 0).long()
loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

global_step = 0
for epoch in range(args.epochs):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        writer.add_scalar("train/loss", loss.item(), global_step)
        global_step += 1
    print(f"epoch {epoch}: loss {loss.item():.4f}")

writer.flush()
if not args.no_close:
    writer.close()
