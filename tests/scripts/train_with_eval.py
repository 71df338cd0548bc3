"""Train from a DataLoader and run a validation pass under torch.no_grad()
every few optimizer steps, as most training scripts do."""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=48)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--eval-every", type=int, default=4)
    parser.add_argument("--val-batches", type=int, default=3)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.samples, 8)
    y = x.sum(dim=1, keepdim=True)
    train = DataLoader(TensorDataset(x, y), batch_size=args.batch)
    vx = torch.randn(args.val_batches * 5, 8)
    val = DataLoader(TensorDataset(vx, vx.sum(dim=1, keepdim=True)), batch_size=5)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    for i, (xb, yb) in enumerate(train):
        optimizer.zero_grad()
        F.mse_loss(model(xb), yb).backward()
        optimizer.step()
        if (i + 1) % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                error = sum(float(F.mse_loss(model(a), b)) for a, b in val)
            model.train()
            print(f"step {i + 1}: val loss {error / len(val):.6f}")


if __name__ == "__main__":
    main()
