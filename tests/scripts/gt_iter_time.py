"""Ground truth from the script's own stopwatch: a small but real training
loop (a two-layer MLP, Adam, a shuffled TensorDataset DataLoader) that times
each full loop iteration itself, the way training scripts log their step
time, and prints the times as one `GT_ITERATIONS [json]` line at the end.

    gt_iter_time.py --steps N --batch B --hidden H

An iteration runs from asking the DataLoader for a batch to asking it for
the next one, so the times add up to the whole loop.
"""

import argparse
import json
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    args = parser.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    x = torch.randn(args.steps * args.batch, 64)
    y = (x[:, :8].sum(dim=1) > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True)
    model = nn.Sequential(
        nn.Linear(64, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden), nn.ReLU(),
        nn.Linear(args.hidden, 2),
    )
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    times = []
    batches = iter(loader)
    t0 = time.perf_counter()
    while True:
        try:
            xb, yb = next(batches)
        except StopIteration:
            break
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        optimizer.step()
        t1 = time.perf_counter()
        times.append(t1 - t0)
        t0 = t1
    print(f"gt_iter_time: {len(times)} iterations, last loss {loss.item():.4f}")
    print("GT_ITERATIONS " + json.dumps(times), flush=True)


if __name__ == "__main__":
    main()
