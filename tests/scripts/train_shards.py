"""Train on CSV shards named on the command line, the way a shell glob
hands them over: `python train_shards.py data/*.csv`, one argument a shard,
however many there are.

    train_shards.py SHARD... [--max-shards N]

Each shard is a CSV of rows `x0,...,x7,y`; the loop trains one step a
shard, on the first N shards only when `--max-shards` is given (the others
need not exist). It first prints how many shards it was given and a digest
of its whole argument list, so a test can tell that every argument arrived
as written.
"""

import argparse
import csv
import hashlib
import sys

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("shards", nargs="+")
    parser.add_argument("--max-shards", type=int, default=None)
    args = parser.parse_args()
    digest = hashlib.sha256("\0".join(sys.argv[1:]).encode()).hexdigest()
    print(f"{len(args.shards)} shards, arguments sha256 {digest}", flush=True)

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    total = 0.0
    for path in args.shards[: args.max_shards]:
        with open(path, newline="") as f:
            rows = [[float(v) for v in row] for row in csv.reader(f)]
        data = torch.tensor(rows)
        x, y = data[:, :8], data[:, 8:]
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"trained on {len(args.shards[: args.max_shards])} shards, loss sum {total:.4f}")


if __name__ == "__main__":
    main()
