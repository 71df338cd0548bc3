"""Trains on a DataLoader, then leaves by os._exit, as scripts do to skip a
slow or hanging teardown (worker processes, a process group, CUDA):

    lifecycle_os_exit.py --steps N --status S [--before-torch]

With --before-torch it leaves before importing torch, at its first line.
"""

import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--status", type=int, default=3)
parser.add_argument("--before-torch", action="store_true")
args = parser.parse_args()
if args.before_torch:
    print("leaving before torch", flush=True)
    os._exit(args.status)

import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

torch.set_num_threads(1)
torch.manual_seed(0)
x = torch.randn(args.steps * 8, 16)
y = x.sum(dim=1, keepdim=True)
loader = DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, (xb, yb) in enumerate(loader):
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(xb), yb)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
print(f"leaving with os._exit({args.status})", flush=True)
os._exit(args.status)
