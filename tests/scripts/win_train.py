"""A small DataLoader training loop for the detailed-window tests.

Each epoch has `--batches` batches, so the loop's end-of-data fetches (the
steps that open and are cancelled by StopIteration) fall at multiples of
`--batches`. Each step also runs a range of the user's own and reads the
loss with `.item()`. `--lr-decay`, a retired option, is still accepted with
a warning of the script's own.
"""

import argparse
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr-decay", type=float, default=None, help="retired; ignored")
    args = parser.parse_args()
    if args.lr_decay is not None:
        warnings.warn("--lr-decay is retired and ignored", UserWarning, stacklevel=1)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.batches * args.batch, 8)
    y = x.sum(dim=1, keepdim=True)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    total = 0.0
    for _epoch in range(args.epochs):
        for xb, yb in loader:
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            with torch.profiler.record_function("win: bookkeeping"):
                total += loss.item()
    print(f"done {total:.3f}")


if __name__ == "__main__":
    main()
