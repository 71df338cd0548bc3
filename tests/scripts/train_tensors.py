"""Train on tensors held in memory: no DataLoader.

`--update optim` steps torch.optim.SGD (zero_grad first, as many scripts
do); `--update manual` is a hand-written SGD update with no optimizer
object at all. `--accum K` runs K forward/backward micro-batches per
optimizer step. `--loss-module` computes the loss with nn.MSELoss, a second
top-level module call per micro-batch, instead of F.mse_loss.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--update", choices=("optim", "manual"), default="optim")
    parser.add_argument("--loss-module", action="store_true")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.batch, 8)
    y = x.sum(dim=1, keepdim=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    loss_fn = nn.MSELoss() if args.loss_module else F.mse_loss
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01) if args.update == "optim" else None

    for step in range(args.steps):
        if optimizer is not None:
            optimizer.zero_grad()
        for _ in range(args.accum):
            loss = loss_fn(model(x), y) / args.accum
            loss.backward()
        if optimizer is not None:
            optimizer.step()
        else:
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.01 * p.grad
                    p.grad = None
        print(f"step {step}: loss {loss.item():.6f}")
    print("done")


if __name__ == "__main__":
    main()
