"""Train a small regression model from a DataLoader.

`--update optim` steps torch.optim.SGD; `--update manual` is a hand-written
SGD update with no optimizer object. `--accum K` accumulates gradients over
K micro-batches per optimizer step. `--persistent` keeps the `--workers`
alive from epoch to epoch (`persistent_workers=True`): the loader then
gives every epoch the same iterator object.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--accum", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--persistent", action="store_true")
    parser.add_argument("--update", choices=("optim", "manual"), default="optim")
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.samples, 8)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, num_workers=args.workers,
                        persistent_workers=args.persistent)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01) if args.update == "optim" else None

    for epoch in range(args.epochs):
        for i, (xb, yb) in enumerate(loader):
            loss = F.mse_loss(model(xb), yb) / args.accum
            loss.backward()
            if (i + 1) % args.accum != 0:
                continue
            if optimizer is not None:
                optimizer.step()
                optimizer.zero_grad()
            else:
                with torch.no_grad():
                    for p in model.parameters():
                        p -= 0.01 * p.grad
                        p.grad = None
        print(f"epoch {epoch}: loss {loss.item():.6f}")
    print("done")


if __name__ == "__main__":
    main()
